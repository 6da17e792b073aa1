"""The JSON of `snoop` records, declared as typed dictionaries for netsleuth.diagnostics.record_schemas (which
makes their JSON Schemas and checks every printed record against them)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from netsleuth.diagnostics.record_parts import Clock, Totals

__all__ = ["SNOOP_RECORD_TYPES"]


class _Process(TypedDict):
    v: int
    time: str
    pid: int
    tid: int
    ppid: int
    uid: int
    comm: str  # after an exec: the new name
    netns: int
    netns_name: str | None
    container: str | None


class ExecJson(_Process):
    type: Literal["exec"]
    path: str  # the file asked for, as given to execve
    args: list[str]  # argv[0..], at most 24, each cut at 127 bytes
    args_truncated: bool
    ret: int
    error: str | None  # ENOENT, EACCES...
    duration_us: float


class ExitJson(_Process):
    type: Literal["exit"]
    exit_code: int | None
    signal: int | None
    runtime_ms: float  # since the exec that was reported


class OpenJson(_Process):
    type: Literal["open"]
    path: str
    flags: str  # O_RDONLY|O_CLOEXEC...
    fd: int | None
    error: str | None
    duration_us: float


class _SnoopGroup(TypedDict):
    kind: str  # "exec", "exit", "open"
    count: int
    example: dict[str, Any]


class _SnoopSummary(Totals):
    type: Literal["summary"]
    v: int
    by_kind: dict[str, Totals]
    attach: str
    interrupted: bool
    clock: Clock
    groups: list[_SnoopGroup]


class SnoopExecSummaryJson(_SnoopSummary):
    diagnostic: Literal["snoop.exec"]


class SnoopOpenSummaryJson(_SnoopSummary):
    diagnostic: Literal["snoop.open"]


SNOOP_RECORD_TYPES: dict[str, type] = {
    "exec": ExecJson,
    "exit": ExitJson,
    "open": OpenJson,
    "summary:snoop.exec": SnoopExecSummaryJson,
    "summary:snoop.open": SnoopOpenSummaryJson,
}
