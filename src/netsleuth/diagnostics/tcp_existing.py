"""The TCP sockets that exist when a trace starts, written into the tcp object's state tracker.

The tracker in bpf/tcp.bpf.c learns a socket from its state changes (connect, listen, accept). A server
started weeks before `netsleuth tcp queues` made those long ago: without this walk its listener is unknown
(a SYN dropped on its full accept queue finds no listener and is not reported), and its connections have no
side, no owner inode and no age. bpf/tcp_existing.bpf.c is a BPF socket iterator (iter/tcp) that writes
what the tracker would have learnt into the tcp object's own `sock_infos` and `listeners` maps; it is run
once per network namespace (an iterator sees the namespace of the task that creates it), after the live
programs are attached, so no socket falls between the walk and the hooks.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netsleuth._generated.tcp_existing_abi import (
    TcpExistingMaps,
    TcpExistingObject,
    TcpExistingPrograms,
    TcpExistingRodata,
)
from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.object import BpfObject

if TYPE_CHECKING:
    from netsleuth._generated.tcp_abi import TcpMaps

__all__ = ["ExistingSockets", "seed_existing_sockets", "walk_namespaces"]

_CLONE_NEWNET = 0x40000000
_PROGRAM = TcpExistingPrograms.nst_existing.name


@dataclass(frozen=True)
class ExistingSockets:
    """What the walk did. `born_ns` is the born_ns written for the sockets it found (CLOCK_MONOTONIC, as
    bpf_ktime_get_ns): an event whose born_ns equals it is about a socket older than the trace. 0 when the
    walk did not run."""

    born_ns: int = 0
    namespaces: int = 0
    problems: tuple[str, ...] = ()

    def existed_before(self, born_ns: int) -> bool:
        return bool(self.born_ns) and born_ns == self.born_ns


def walk_namespaces(link_fd: int, netns_paths: Sequence[str]) -> tuple[int, list[str]]:
    """Run the iterator behind `link_fd` once inside each namespace file in `netns_paths`. A thread of our
    own enters them (setns(2) moves only the calling thread) and ends with them, so this process never
    moves. Returns how many namespaces were walked and a sentence per one that could not be."""
    library = _libbpf.lib()
    libc = ctypes.CDLL(None, use_errno=True)
    walked = 0
    problems: list[str] = []

    def walk(paths: Sequence[str]) -> None:
        nonlocal walked
        for path in paths:
            try:
                netns_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as error:
                problems.append(f"cannot open network namespace {path}: {error.strerror}")
                continue
            try:
                if libc.setns(netns_fd, _CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    problems.append(f"cannot enter network namespace {path}: {os.strerror(code)}")
                    continue
            finally:
                os.close(netns_fd)
            iterator = library.bpf_iter_create(link_fd)
            if iterator < 0:
                problems.append(f"cannot list the TCP sockets of {path}: {os.strerror(-iterator)}")
                continue
            try:
                while os.read(iterator, 4096):  # the program prints nothing: reading runs it to the end
                    pass
                walked += 1
            except OSError as error:
                problems.append(f"listing the TCP sockets of {path} failed: {error.strerror}")
            finally:
                os.close(iterator)

    # Each walk scans the kernel's whole TCP hash tables for one namespace's sockets (~7 ms here): one thread
    # for all of them, since more threads only contend for the same buckets.
    thread = threading.Thread(target=walk, args=(netns_paths,), name="netsleuth-existing", daemon=True)
    thread.start()
    thread.join()
    return walked, problems


def seed_existing_sockets(tcp_maps: TcpMaps, netns_paths: Sequence[str]) -> ExistingSockets:
    """Walk the TCP sockets of every namespace in `netns_paths` into the tcp object's tracker maps. A kernel
    without TCP iterators (before 5.9) or that refuses the program yields a problem sentence, not an error:
    the trace still works, for sockets born while it runs."""
    born_ns = time.monotonic_ns()
    try:
        with BpfObject.open_generated(TcpExistingObject.object_name) as walker:
            walker.reuse_map(TcpExistingMaps.sock_infos.name, tcp_maps.sock_infos.fd)
            walker.reuse_map(TcpExistingMaps.listeners.name, tcp_maps.listeners.fd)
            walker.set_rodata(TcpExistingRodata.existing_born_ns, ctypes.c_uint64(born_ns))
            walker.load([_PROGRAM])
            walker.attach(_PROGRAM)
            walked, problems = walk_namespaces(walker.link_fd(_PROGRAM), netns_paths)
    except BpfError as error:
        return ExistingSockets(
            problems=(f"sockets opened before the trace are not known (listeners, sides, owners): {error}",)
        )
    return ExistingSockets(born_ns, walked, tuple(problems))
