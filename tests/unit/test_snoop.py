"""snoop without the kernel: configs from JSON and flags, open flags and exit statuses in words, and ring
records (struct snoop_event + NUL-separated arguments) decoded into records."""

from __future__ import annotations

import ctypes

import pytest

from netsleuth._generated.snoop_abi import SnoopEventC, SnoopEventKind, SnoopFlag
from netsleuth.diagnostics.registry import get_diagnostic
from netsleuth.diagnostics.snoop.records import ExecRecord, ExitRecord, OpenRecord, open_flags_text
from netsleuth.diagnostics.snoop.session import SnoopNamer, decode
from netsleuth.errors import UsageError
from netsleuth.kernel.context import KernelClock, KernelContext
from netsleuth.kernel.netns import NetnsNames
from netsleuth.spec.records import encode


@pytest.mark.parametrize(
    ("flags", "text"),
    [
        (0, "O_RDONLY"),
        (0o2000000, "O_RDONLY|O_CLOEXEC"),
        (0o1 | 0o100 | 0o1000, "O_WRONLY|O_CREAT|O_TRUNC"),
        (0o2 | 0o100 | 0o200, "O_RDWR|O_CREAT|O_EXCL"),
        (0o200000 | 0o400000, "O_RDONLY|O_DIRECTORY|O_NOFOLLOW"),
        (0o2 | 0o20200000, "O_RDWR|O_TMPFILE"),
    ],
)
def test_open_flags_in_words(flags: int, text: str) -> None:
    assert open_flags_text(flags) == text


def test_json_configs_validate_like_the_flags() -> None:
    spec = get_diagnostic("snoop.open")
    config = spec.config_from_json({"pid": 42, "comm": "nginx", "failed": True, "summary": True})
    assert (config.pid, config.comm, config.failed, config.summary) == (42, "nginx", True, True)
    # A packet filter means nothing for a process trace: not an option of snoop at all.
    with pytest.raises(UsageError, match=r"dport is not an option of snoop\.open"):
        spec.config_from_json({"dport": 53})
    with pytest.raises(UsageError, match="is not a process id"):
        spec.config_from_json({"pid": "-3"})
    with pytest.raises(UsageError, match="is not a name of 1 to 15 characters"):
        spec.config_from_json({"comm": "x" * 16})


def _namer() -> SnoopNamer:
    context = KernelContext(
        netns_names=NetnsNames(proc_root="/nonexistent", netns_dirs=()),
        clock=KernelClock(0, 1_000_000_000_000),
    )
    return SnoopNamer(context)


def _event(kind: int, **fields: object) -> SnoopEventC:
    event = SnoopEventC(kind=kind, pid=4242, tid=4242, ppid=1, uid=0, netns=4026531840, time_ns=5_000)
    for name, value in fields.items():
        setattr(event, name, value)
    return event


def test_exec_record_with_arguments_and_truncation() -> None:
    args = b"sh\0-c\0exit 7\0"
    event = _event(
        SnoopEventKind.EXEC,
        comm=b"sh",
        path=b"/usr/bin/sh",
        args_count=3,
        args_size=len(args),
        flags=int(SnoopFlag.ARGS_TRUNCATED),
        duration_ns=250_000,
    )
    raw = bytes(event) + args
    decoded, tail = decode(raw)
    assert ctypes.sizeof(decoded) == len(bytes(event)) and tail == args
    record = _namer().record(decoded, tail)
    assert isinstance(record, ExecRecord)
    assert record.args == ("sh", "-c", "exit 7") and record.args_truncated
    json = record.to_json()
    assert json["path"] == "/usr/bin/sh" and json["error"] is None and json["duration_us"] == 250.0
    assert encode(record).startswith(b'{"type":"exec",')


def test_failed_exec_names_its_errno() -> None:
    record = _namer().record(_event(SnoopEventKind.EXEC, ret=-2, path=b"/nope"))
    assert isinstance(record, ExecRecord) and record.to_json()["error"] == "ENOENT"


@pytest.mark.parametrize(("status", "code", "signal"), [(0x700, 7, None), (0, 0, None), (9, None, 9)])
def test_exit_status_is_code_or_signal(status: int, code: int | None, signal: int | None) -> None:
    record = _namer().record(_event(SnoopEventKind.EXIT, ret=status, duration_ns=3_000_000))
    assert isinstance(record, ExitRecord)
    assert (record.exit_code, record.signal, record.runtime_ms) == (code, signal, 3.0)


def test_open_record_fd_or_error() -> None:
    ok = _namer().record(_event(SnoopEventKind.OPEN, ret=3, path=b"/etc/hosts", open_flags=0o2000000))
    failed = _namer().record(_event(SnoopEventKind.OPEN, ret=-13, path=b"/root/x"))
    assert isinstance(ok, OpenRecord) and isinstance(failed, OpenRecord)
    assert (ok.to_json()["fd"], ok.to_json()["error"], ok.to_json()["flags"]) == (
        3,
        None,
        "O_RDONLY|O_CLOEXEC",
    )
    assert (failed.to_json()["fd"], failed.to_json()["error"]) == (None, "EACCES")
