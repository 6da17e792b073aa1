"""Conntrack's own events - an entry created (NEW), changed (UPDATE), destroyed (DESTROY) - from the
ctnetlink multicast groups (include/uapi/linux/netfilter/nfnetlink.h enum nfnetlink_groups), in the
namespaces asked for, each stamped with the wall clock the moment it arrives.

When a NAT happened: the kernel sends NEW when the entry is confirmed - its first packet has passed the
namespace's last hook with the translation set up (nf_conntrack_confirm -> nf_ct_deliver_cached_events), so
the reply tuple the message carries is the translated one - and it does so in the packet's own path, before
the packet goes on. A thread blocked in poll() on the sockets reads it at once: the stamp is the event's time
plus the wake-up of the reader (ctnetlink messages carry no time of their own; SO_TIMESTAMPNS gives no
stamp on netlink sockets, tried on 6.18). The stamp is therefore never early, only late by that wake-up.
The reader is a small helper process (`python -I -S`, the standard library only, the subscribed sockets
handed over as file descriptors), not a thread of the agent: a thread must first win Python's GIL from the
agent's busy threads, and on a loaded 2-CPU host that put the stamp of a REDIRECT's NEW 9 ms after the
packet; the helper's stamp waits for the scheduler only. It sends (stamp, datagram) frames on a pipe to a
thread of ours, which parses them at leisure, and exits when the pipe's other end closes (the agent gone).

Where the operator has turned on net.netfilter.nf_conntrack_timestamp, the kernel stamps each entry when it
creates it (CTA_TIMESTAMP_START, wall clock): that exact time is taken instead (`created_ns`).

What it can see: entries created while a listener exists. With nf_conntrack_events=2 (the default) the kernel
gives an entry its event extension only if someone listens when it is created (nf_ct_ecache_ext_add), so
subscribe before the traffic you want to time; entries older than the subscription send no UPDATE or
DESTROY either (read the table for those: kernel/conntrack.py). Events a full socket cannot take are lost by
the kernel (ENOBUFS on the next read): counted in `lost`, never silent.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from netsleuth.diagnostics.nat_join import ConntrackEntry
from netsleuth.kernel.conntrack import (
    Namespace,
    created_ns,
    entry_from_message,
    messages,
    netlink_sockets,
    subscribe,
)

__all__ = ["ConntrackEvent", "ConntrackEvents", "EventKind", "event_kind"]

EventKind = Literal["new", "update", "destroy"]
# enum nfnetlink_groups: NFNLGRP_CONNTRACK_NEW, _UPDATE, _DESTROY.
_GROUPS = (1, 2, 3)
_IPCTNL_MSG_CT_NEW, _IPCTNL_MSG_CT_DELETE = 0, 2
_NLM_F_CREATE = 0x400  # set, with NLM_F_EXCL, on NEW events only (ctnetlink_conntrack_event)
_HEADER = struct.Struct("=IHHII")
_DEFAULT_LIMIT = 4096  # events kept between two takes; more are counted in `cut`


@dataclass(frozen=True)
class ConntrackEvent:
    kind: EventKind
    entry: ConntrackEntry
    wall_ns: int  # when it was read off the socket: the event's own time plus the helper's wake-up
    # When the kernel created the entry, if it stamps entries (nf_conntrack_timestamp=1): exact.
    created_ns: int | None = None


def event_kind(message: bytes) -> EventKind | None:
    """NEW, UPDATE or DESTROY from a ctnetlink event message's header; None for anything else."""
    if len(message) < _HEADER.size:
        return None
    _, kind, flags, _, _ = _HEADER.unpack_from(message, 0)
    if kind & 0xFF == _IPCTNL_MSG_CT_DELETE:
        return "destroy"
    if kind & 0xFF == _IPCTNL_MSG_CT_NEW:
        return "new" if flags & _NLM_F_CREATE else "update"
    return None


# The helper: argv = the sockets' descriptors; stdin = the agent's end (its closing ends the helper); stdout =
# frames (stamp, socket index, kind 0 data / 1 overrun, length) + the datagram.
_STAMPER = r"""
import errno, os, select, socket, struct, sys, time
socks = [socket.socket(fileno=int(fd)) for fd in sys.argv[1:]]
frame = struct.Struct("=QHBI")
poller = select.poll()
poller.register(0, select.POLLIN)
for sock in socks:
    sock.setblocking(False)
    poller.register(sock.fileno(), select.POLLIN)
index = {sock.fileno(): number for number, sock in enumerate(socks)}
out = os.fdopen(1, "wb", buffering=0)
while True:
    for fd, _ in poller.poll():
        if fd == 0:
            sys.exit(0)
        sock = socks[index[fd]]
        while True:
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                break
            except OSError as error:
                if error.errno != errno.ENOBUFS:
                    break
                out.write(frame.pack(time.time_ns(), index[fd], 1, 0))
                continue
            out.write(frame.pack(time.time_ns(), index[fd], 0, len(data)) + data)
"""
_FRAME = struct.Struct("=QHBI")


class ConntrackEvents:
    """Subscribed on creation (so entries created from then on are reported); `start()` hands the sockets
    to the stamping helper and begins reading its frames on a thread, `take()` hands over what arrived,
    `close()` stops and closes everything.

    `wanted` picks the entries worth keeping (the rest are parsed and dropped at once); `problems` names
    the namespaces that could not be watched; `lost` counts reads the kernel reported as overrun (each is
    one or more lost events), `cut` the events beyond `limit` between two takes."""

    def __init__(
        self,
        namespaces: Iterable[Namespace],
        wanted: Callable[[ConntrackEntry], bool] = lambda entry: True,
        limit: int = _DEFAULT_LIMIT,
        python: str = sys.executable,
    ) -> None:
        self._wanted = wanted
        self._limit = limit
        self._python = python
        self._sockets: list[tuple[socket.socket, str]] = []
        self._events: list[ConntrackEvent] = []
        self._lock = threading.Lock()
        self._helper: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.problems: list[str] = []
        self.lost = 0
        self.cut = 0
        listed = list(namespaces)
        sockets = netlink_sockets(listed, 1)  # one forked helper for all of them
        for inode, _, where in listed:
            made = sockets[inode]
            if isinstance(made, OSError):
                self.problems.append(f"conntrack events of {where} not watched: {made}")
                continue
            try:
                subscribe(made[0], _GROUPS)
            except OSError as error:
                made[0].close()
                self.problems.append(f"conntrack events of {where} not watched: {error}")
                continue
            self._sockets.append((made[0], where))
        self.watching = [where for _, where in self._sockets]

    def start(self) -> None:
        if self._helper is not None or not self._sockets:
            return
        fds = [sock.fileno() for sock, _ in self._sockets]
        self._helper = subprocess.Popen(
            [self._python, "-I", "-S", "-c", _STAMPER, *map(str, fds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=fds,
        )
        for sock, _ in self._sockets:
            sock.close()  # the helper holds them now
        self._thread = threading.Thread(target=self._read_frames, name="conntrack-events", daemon=True)
        self._thread.start()

    def take(self) -> list[ConntrackEvent]:
        """The events read since the last take, in the order they arrived."""
        with self._lock:
            taken, self._events = self._events, []
        return taken

    def close(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            assert helper.stdin is not None
            helper.stdin.close()  # the helper exits on its own
            try:
                helper.wait(5)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait(5)
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if helper is not None and helper.stdout is not None:
            helper.stdout.close()
        for sock, _ in self._sockets:
            sock.close()
        self._sockets.clear()

    def __enter__(self) -> ConntrackEvents:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the reading thread ----------------------------------------------------------------------------
    def _read_frames(self) -> None:
        assert self._helper is not None and self._helper.stdout is not None
        stream, where_of = self._helper.stdout, self.watching
        while len(header := stream.read(_FRAME.size)) == _FRAME.size:
            stamp, number, kind, length = _FRAME.unpack(header)
            data = stream.read(length) if length else b""
            if kind == 1:  # the kernel dropped events for this socket: say so
                self.lost += 1
                continue
            self._keep(data, where_of[number], stamp)

    def _keep(self, data: bytes, where: str, stamp: int) -> None:
        for message in messages(data):
            kind = event_kind(message)
            entry = entry_from_message(message, where) if kind is not None else None
            if kind is None or entry is None or not self._wanted(entry):
                continue
            with self._lock:
                if len(self._events) >= self._limit:
                    self.cut += 1
                else:
                    self._events.append(ConntrackEvent(kind, entry, stamp, created_ns(message)))
