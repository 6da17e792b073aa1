"""TCP peers for the resets/tcp/conn tests: small Python programs run inside the lab's namespaces.

Servers print READY once listening (and ACCEPTED after accept) so tests wait on output, never on time.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.netlab import Host

__all__ = ["HeldClient", "Server", "connect", "send_segment"]

_CONNECT = """
import socket, sys, time
family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET
s = socket.socket(family)
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    if len(sys.argv) > 4 and sys.argv[4]:
        s.sendall(sys.argv[4].encode())
    s.recv(100)
    print('CLOSED')
except OSError as error:
    print('ERROR', error.errno)
"""

# Modes: linger0 (abortive close after accept), unread (close while the client's bytes are unread),
# hold (accept and keep), never_accept (listen with backlog 1 and never accept), drain (read to EOF, answer
# with `extra` bytes, close).
_SERVER = """
import socket, struct, sys, time
family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET
mode = sys.argv[3]
l = socket.socket(family)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2])))
l.listen(1 if mode == 'never_accept' else 16)
print('READY', flush=True)
if mode == 'never_accept':
    time.sleep(60)
    sys.exit()
c, _ = l.accept()
print('ACCEPTED', flush=True)
if mode == 'linger0':
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    c.close()
elif mode == 'unread':
    deadline = time.time() + 10
    while time.time() < deadline:  # wait until the client's bytes are queued, unread
        import fcntl, termios, array
        pending = array.array('i', [0])
        fcntl.ioctl(c.fileno(), termios.FIONREAD, pending)
        if pending[0] >= int(sys.argv[4]):
            break
        time.sleep(0.01)
    c.close()
elif mode == 'drain':  # read until the client closes, answer, close
    received = 0
    while True:
        data = c.recv(65536)
        if not data:
            break
        received += len(data)
    c.sendall(b'y' * int(sys.argv[4]))
    c.close()
print('DONE', flush=True)
time.sleep(60)
"""


class Server:
    """A TCP server in a namespace; use as a context manager (it is killed on exit)."""

    def __init__(self, host: Host, address: str, port: int, mode: str, extra: str = "0") -> None:
        self.process = subprocess.Popen(
            host.argv(sys.executable, "-c", _SERVER, address, str(port), mode, extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid

    def wait_line(self, expected: str) -> None:
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                stderr = self.process.stderr.read() if self.process.stderr else ""
                raise AssertionError(f"server exited before printing {expected}: {stderr}")
            if line.strip() == expected:
                return

    def __enter__(self) -> Server:
        self.wait_line("READY")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.process.kill()
        self.process.wait()


def connect(host: Host, address: str, port: int, timeout: float = 3.0, payload: str = "") -> str:
    """Connect (and optionally send `payload`), wait for the peer to close; returns CLOSED or ERROR "
    "<errno>."""
    result = host.run(sys.executable, "-c", _CONNECT, address, str(port), str(timeout), payload, check=False)
    return result.stdout.strip()


_SEGMENT = """
import sys
from scapy.all import IP, IPv6, TCP, send
src, dst, sport, dport, flags, seq, ack = sys.argv[1:8]
ip = IPv6(src=src, dst=dst) if ':' in dst else IP(src=src, dst=dst)
send(ip / TCP(sport=int(sport), dport=int(dport), flags=flags, seq=int(seq), ack=int(ack)), verbose=False)
"""


def send_segment(
    host: Host, src: str, dst: str, sport: int, dport: int, flags: str, seq: int, ack: int
) -> None:
    """Craft one TCP segment with scapy (a raw socket: the sender's kernel keeps no state for it)."""
    host.run(sys.executable, "-c", _SEGMENT, src, dst, str(sport), str(dport), flags, str(seq), str(ack))


_HELD_CLIENT = """
import socket, sys
family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET
s = socket.socket(family)
s.connect((sys.argv[1], int(sys.argv[2])))
print('CONNECTED', s.getsockname()[1], flush=True)
for line in sys.stdin:
    command, _, argument = line.strip().partition(' ')
    if command == 'send':
        s.send(b'x' * int(argument))
    elif command == 'close':
        s.close()
        print('CLOSED', flush=True)
    elif command == 'finish':  # half-close, read the answer to EOF, close: a graceful end on both sides
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
        s.close()
        print('CLOSED', flush=True)
"""


class HeldClient:
    """A connected client that acts on command: `send(n)`, `close()`; killed on exit."""

    def __init__(self, host: Host, address: str, port: int) -> None:
        self.process = subprocess.Popen(
            host.argv(sys.executable, "-c", _HELD_CLIENT, address, str(port)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if not line or line[0] != "CONNECTED":
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AssertionError(f"client did not connect: {stderr}")
        self.local_port = int(line[1])

    def _command(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def send(self, count: int) -> None:
        self._command(f"send {count}")

    def close(self, graceful: bool = False) -> None:
        """close(), or with `graceful` shutdown(SHUT_WR) and read until the server closes too."""
        self._command("finish" if graceful else "close")
        assert self.process.stdout is not None
        while self.process.stdout.readline().strip() not in ("CLOSED", ""):
            pass

    def __enter__(self) -> HeldClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.process.kill()
        self.process.wait()
