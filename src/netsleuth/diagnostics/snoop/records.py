"""`snoop`'s config and records: what a user asks for and what each exec, exit and open reads as."""

from __future__ import annotations

import errno
from typing import Annotated

import msgspec

from netsleuth.spec.common import TaskConfig
from netsleuth.spec.options import Opt
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import NetnsField
from netsleuth.spec.summary import Summary, TotalsPart

__all__ = [
    "ExecRecord",
    "ExitRecord",
    "OpenRecord",
    "SnoopConfig",
    "SnoopGroup",
    "SnoopRecord",
    "SnoopSummary",
    "error_name",
    "open_flags_text",
]

# include/uapi/asm-generic/fcntl.h (x86-64 values), the flags opensnoop users read.
_ACCESS = {0: "O_RDONLY", 1: "O_WRONLY", 2: "O_RDWR"}
_OPEN_FLAGS = (
    (0o100, "O_CREAT"),
    (0o200, "O_EXCL"),
    (0o1000, "O_TRUNC"),
    (0o2000, "O_APPEND"),
    (0o4000, "O_NONBLOCK"),
    (0o200000, "O_DIRECTORY"),
    (0o400000, "O_NOFOLLOW"),
    (0o2000000, "O_CLOEXEC"),
    (0o10000000, "O_PATH"),
    (0o20200000, "O_TMPFILE"),
)


def open_flags_text(flags: int) -> str:
    names = [_ACCESS.get(flags & 3, f"0x{flags & 3:x}")]
    for bit, name in _OPEN_FLAGS:
        if flags & bit == bit and not (name == "O_DIRECTORY" and flags & 0o20200000 == 0o20200000):
            names.append(name)
    return "|".join(names)


def error_name(ret: int) -> str | None:
    return errno.errorcode.get(-ret, str(ret)) if ret < 0 else None


# -- config --------------------------------------------------------------------------------------------


class SnoopConfig(TaskConfig, frozen=True, kw_only=True):
    failed: Annotated[bool, Opt("only calls that failed (exec: also non-zero exits)")] = False


# -- records -------------------------------------------------------------------------------------------


class _Process(Record, kw_only=True, frozen=True):
    time: WallTime
    pid: int
    tid: int
    ppid: int
    uid: int
    comm: str
    netns: NetnsField
    netns_name: str | None
    container: str | None


class ExecRecord(_Process, frozen=True, kw_only=True, tag="exec"):
    path: str
    args: tuple[str, ...]
    args_truncated: bool
    ret: int
    error: str | None  # the errno name of a failed exec
    duration_us: float


class ExitRecord(_Process, frozen=True, kw_only=True, tag="exit"):
    exit_code: int | None  # None when a signal ended it
    signal: int | None
    runtime_ms: float  # since the exec that was reported


class OpenRecord(_Process, frozen=True, kw_only=True, tag="open"):
    path: str
    flags: str  # O_RDONLY|O_CLOEXEC...
    fd: int | None
    error: str | None
    duration_us: float


SnoopRecord = ExecRecord | ExitRecord | OpenRecord


class SnoopGroup(msgspec.Struct, frozen=True, kw_only=True):
    """Exact count of one (kind, name, path prefix, result, netns), with the first event as its example."""

    kind: str
    count: int
    example: SnoopRecord


class SnoopSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    by_kind: dict[str, TotalsPart]
    groups: tuple[SnoopGroup, ...]
