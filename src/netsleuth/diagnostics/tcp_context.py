"""What every tcp-family diagnostic needs to turn raw events into records: clock, names, owners, netns names,
stacks. One per run; everything is cached (events come in bursts)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence

from netsleuth.diagnostics.attribution import OwnerFacts, attribute_owner
from netsleuth.diagnostics.drops_enrich import Owner
from netsleuth.diagnostics.tcp_names import TcpNames, load_tcp_names
from netsleuth.diagnostics.tcp_session import RawTcpEvent
from netsleuth.kernel.kallsyms import Kallsyms, default_kallsyms
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.process import ContainerCache, SocketOwners

__all__ = ["TcpContext", "endpoint_text", "iso_time", "owner_json", "owner_text"]

# Frames of the tracing machinery itself, above the kernel function that hit the tracepoint.
_TRACING_PREFIXES = ("bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_", "bpf_get_stack")


def endpoint_text(address: str | None, port: int | None) -> str:
    """`198.18.0.1:80`, `[2001:db8::1]:80`, `*:80` for an unbound address."""
    if address is None:
        return "?" if port is None else f"?:{port}"
    if port is None:
        return address
    shown = "*" if address in ("0.0.0.0", "::") else address
    return f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"


def iso_time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="microseconds")


def owner_text(owner: Owner) -> str:
    if owner.pid is None:
        return "the kernel"
    text = f"{owner.comm}[{owner.pid}]"
    if owner.container:
        text += f" (container {owner.container})"
    return text


def owner_json(owner: Owner) -> dict[str, object]:
    return {"pid": owner.pid, "comm": owner.comm, "owner": owner.source, "container": owner.container}


class TcpContext:
    def __init__(
        self,
        names: TcpNames | None = None,
        kallsyms: Kallsyms | None = None,
        netns_names: NetnsNames | None = None,
        owners: SocketOwners | None = None,
    ) -> None:
        self.names = names or load_tcp_names()
        self.kallsyms = kallsyms or default_kallsyms()
        self.netns_names = netns_names or NetnsNames()
        self.owners = owners or SocketOwners()
        # bpf_ktime_get_ns() is CLOCK_MONOTONIC; one offset turns it into wall-clock time.
        self._wall_offset = time.time() - time.monotonic()
        self._symbols: dict[int, str] = {}
        self._containers = ContainerCache(self.owners.proc_root)

    def prepare(self) -> None:
        """Read kallsyms, netns names and socket owners now, so the first events are not delayed by it."""
        self.kallsyms.load()
        self.netns_names.refresh()
        self.owners.rescan()

    def wall_time(self, monotonic_ns: int) -> float:
        return monotonic_ns / 1e9 + self._wall_offset

    def netns_name(self, inode: int) -> str | None:
        return self.netns_names.name_of(inode) if inode else None

    def netns_label(self, inode: int) -> str:
        name = self.netns_name(inode)
        return f"netns {name}" if name else f"netns {inode}"

    def owner(self, raw: RawTcpEvent, task_acts_on_socket: bool = False) -> Owner:
        task = task_acts_on_socket and raw.in_task and not raw.kthread and raw.pid
        return attribute_owner(
            OwnerFacts(
                task_pid=raw.pid if task else None,
                task_comm=raw.comm,
                tracked_pid=raw.owner_pid,
                tracked_comm=raw.owner_comm,
                sock_ino=raw.sock_ino,
            ),
            self.owners,
            self._containers,
        )

    def symbol(self, address: int) -> str:
        text = self._symbols.get(address)
        if text is None:
            text = self.kallsyms.format(address)
            self._symbols[address] = text
        return text

    def stack(self, frames: Sequence[int]) -> tuple[str, ...]:
        """The kernel stack from the traced function outwards (our program's own frames removed)."""
        symbols = [self.symbol(address) for address in frames]
        start = 0
        for index, text in enumerate(symbols):
            if text.startswith(_TRACING_PREFIXES):
                start = index + 1
        return tuple(symbols[start:])

    def function_names(self, frames: Sequence[int]) -> list[str]:
        return [text.split("+", 1)[0] for text in self.stack(frames)]
