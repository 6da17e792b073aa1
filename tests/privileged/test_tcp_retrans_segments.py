"""`tcp retrans --summary` counts retransmitted segments the way the kernel's TcpRetransSegs does.

TCP sends GSO skbs, so one retransmitted skb can be several segments; RetransSegs (/proc/net/snmp) counts
segments. A bulk transfer over veth (GSO on) loses a random tenth of its data packets to an nftables rule in
the receiving namespace (tc netem is not available here), and the summary's segment total must equal the
growth of the sender namespace's RetransSegs, exactly.
"""

from __future__ import annotations

import subprocess
import sys

from tests.netlab import Host
from tests.privileged.conftest import Pair
from tests.privileged.tcp_helpers import Server
from tests.tracerun import TraceRun

PORT = 7105
PAYLOAD = 3 << 20

# Send PAYLOAD bytes, close the sending side, read the server's answer to EOF.
_BULK_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
s.sendall(b'x' * int(sys.argv[3]))
s.shutdown(socket.SHUT_WR)
while s.recv(65536):
    pass
print('DONE', flush=True)
"""

# Random loss of the data segments arriving at the server: numgen draws 0..9 per packet.
_LOSS = f"""
table inet nst_loss {{
    chain input {{
        type filter hook input priority 0; policy accept;
        tcp dport {PORT} numgen random mod 10 < 1 drop
    }}
}}
"""


def retrans_segs(host: Host) -> int:
    """Tcp RetransSegs of the host's namespace (the Tcp: header line, then the values line)."""
    lines = [line.split() for line in host.run("cat", "/proc/net/snmp").stdout.splitlines()]
    header, values = [line for line in lines if line and line[0] == "Tcp:"][:2]
    return int(values[header.index("RetransSegs")])


def test_summary_segments_equal_the_growth_of_retranssegs(pair: Pair) -> None:
    pair.b.run("nft", "-f", "-", input_text=_LOSS)
    with (
        Server(pair.b, pair.b4, PORT, "drain", "1000"),
        TraceRun("tcp", "retrans", "--summary", "--netns", pair.a.name) as trace,
    ):
        trace.wait_ready()
        before = retrans_segs(pair.a)
        client = subprocess.run(
            pair.a.argv(sys.executable, "-c", _BULK_CLIENT, pair.b4, str(PORT), str(PAYLOAD)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert client.stdout.strip() == "DONE", client.stderr
        grown = retrans_segs(pair.a) - before
        assert trace.stop() == 0
        summary = trace.summary()
    # The loss is random, but a tenth of ~2000 data segments is never none.
    assert grown > 0
    assert summary["segments"] == grown, summary
    assert sum(group["segments"] for group in summary["groups"]) == grown
    # `total` counts retransmitted skbs: never more than the segments they carried.
    assert 0 < summary["total"] <= summary["segments"]
    assert summary["lost"] == 0
