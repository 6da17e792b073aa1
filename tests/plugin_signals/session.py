"""The plug-in's kernel side attached, and its records as text."""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netsleuth.bpf.object import BpfObject
from netsleuth.bpf.ringbuf import RingBuffer
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.kernel.netns import resolve_netns_arg
from netsleuth.kernel.tracefs import ensure_tracefs
from netsleuth.spec.records import WallTime
from netsleuth.spec.summary import ClockPart, Summary

from .records import SignalRecord, SignalsConfig, SignalsSummary

OBJECT = Path(__file__).resolve().parent / "signals.bpf.o"  # built into the package by its distribution
SEEN, MATCHED, LOST = 0, 1, 2


class _Config(ctypes.Structure):
    c_name = "signals_cfg"
    _fields_ = (("netns", ctypes.c_uint32),)


class _Event(ctypes.Structure):
    _fields_ = (
        ("time_ns", ctypes.c_uint64),
        ("pid", ctypes.c_uint32),
        ("netns", ctypes.c_uint32),
        ("target", ctypes.c_int32),
        ("sig", ctypes.c_int32),
        ("comm", ctypes.c_char * 16),
    )


def _netns_of(pid: int) -> int | None:
    if pid <= 0:
        return None  # a process group or every process: no one namespace
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class SignalsDiagnostic:
    def __init__(self, config: SignalsConfig) -> None:
        self.config = config
        self.attach_kind = ""
        self._object: BpfObject | None = None
        self._ring: RingBuffer | None = None
        self._netns: int | None = None
        self._offset_ns = time.time_ns() - time.monotonic_ns()
        self._monotonic_ns = time.monotonic_ns()

    def start(self) -> None:
        self._netns = resolve_netns_arg(self.config.netns) if self.config.netns is not None else None
        ensure_tracefs()
        bpf_object = BpfObject(OBJECT)
        try:
            bpf_object.set_rodata("cfg", _Config(self._netns or 0))
            bpf_object.load(["signals_kill"])
            bpf_object.attach("signals_kill")
        except BaseException:
            bpf_object.close()
            raise
        self._object = bpf_object
        self._ring = RingBuffer(bpf_object.map("events").fd)
        self.attach_kind = "tracepoint"

    def _records(self, raw: list[bytes]) -> list[SignalRecord]:
        records = []
        for blob in raw:
            event = _Event.from_buffer_copy(blob[: ctypes.sizeof(_Event)])
            records.append(
                SignalRecord(
                    time=WallTime((event.time_ns + self._offset_ns) / 1e9),
                    pid=event.pid,
                    comm=event.comm.decode(errors="replace"),
                    netns=event.netns,
                    target_pid=event.target,
                    signal=event.sig,
                    target_netns=_netns_of(event.target),
                )
            )
        return records

    def poll(self, timeout_ms: int) -> list[SignalRecord]:
        if self._ring is None:
            time.sleep(timeout_ms / 1000)
            return []
        return self._records(self._ring.poll(timeout_ms))

    def drain(self) -> list[SignalRecord]:
        return self._records(self._ring.drain()) if self._ring is not None else []

    def _counters(self) -> list[int]:
        if self._object is None:
            return [0, 0, 0]
        counters = self._object.map("counters")
        return [
            sum(
                int.from_bytes(value[:8], "little")
                for value in counters.lookup_per_cpu(i.to_bytes(4, "little"))
            )
            for i in (SEEN, MATCHED, LOST)
        ]

    def totals(self) -> EventTotals:
        seen, matched, lost = self._counters()
        return EventTotals(seen=seen, matched=matched, emitted=matched - lost, lost=lost)

    def summary(self, interrupted: bool) -> SignalsSummary:
        return SignalsSummary(
            **Summary.totals_fields(self.totals()),
            diagnostic="signals",
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(
                monotonic_ns=self._monotonic_ns,
                wall_ns=self._monotonic_ns + self._offset_ns,
                offset_ns=self._offset_ns,
            ),
            netns_filter=self._netns,
        )

    def program_fds(self) -> dict[str, int]:
        if self._object is None:
            return {}
        return {name: self._object.program_fd(name) for name in self._object.attached_programs()}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        if self._object is not None:
            self._object.close()
            self._object = None
            self._ring = None


class SignalsView:
    noun = "signals"

    def lines(self, records: Sequence[Any]) -> str:
        return "".join(
            f"{r.comm}[{r.pid}] netns {r.netns} -> kill({r.target_pid}, {r.signal}) netns {r.target_netns}\n"
            for r in records
        )

    def finish(self, summary: Any, totals: EventTotals, show_groups: bool) -> None:
        print(f"{totals.matched} signal(s), {totals.lost} lost")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.lost} signal(s) lost"
