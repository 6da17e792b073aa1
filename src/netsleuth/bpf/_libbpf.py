"""Every ctypes declaration of the system libbpf (Debian `libbpf1`, >= 1.0) in one place.

libbpf 1.x reports failure by returning NULL or a negative errno and setting errno, so every function is
declared with use_errno and the callers in this package turn failures into `BpfError`s. Nothing outside
netsleuth.bpf imports this module.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from netsleuth.errors import EnvironmentProblem

__all__ = [
    "BTF_KIND_ENUM",
    "BTF_KIND_ENUM64",
    "BTF_KIND_FUNC_PROTO",
    "BTF_KIND_PTR",
    "BTF_KIND_TYPEDEF",
    "ObjectOpenOpts",
    "PerfLostCallback",
    "PerfSampleCallback",
    "RingBufferCallback",
    "capture_messages",
    "lib",
    "mapped_readonly",
    "open_library",
]

BTF_KIND_PTR = 2
BTF_KIND_ENUM = 6
BTF_KIND_TYPEDEF = 8
BTF_KIND_FUNC_PROTO = 13
BTF_KIND_ENUM64 = 19

# int (*)(void *ctx, void *data, size_t size)
RingBufferCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
# void (*)(void *ctx, int cpu, void *data, __u32 size) and void (*)(void *ctx, int cpu, __u64 cnt)
PerfSampleCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32)
PerfLostCallback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64)
# int (*)(enum libbpf_print_level level, const char *fmt, va_list args); va_list decays to a pointer on x86-64
_PrintCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class ObjectOpenOpts(ctypes.Structure):
    """struct bpf_object_open_opts (libbpf.h, 1.0+) up to btf_custom_path; `sz` tells libbpf where it ends.

    btf_custom_path makes libbpf do the CO-RE relocations against that BTF instead of the running kernel's:
    how the committed objects are checked against older kernels (tests/fixtures/kernel/btf/).
    """

    _fields_ = (
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("_removed_attach_prog_fd", ctypes.c_uint32),
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
    )


_P = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "bpf_object__open_file": (_P, [ctypes.c_char_p, _P]),
    "bpf_object__load": (ctypes.c_int, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__btf": (_P, [_P]),
    "bpf_object__find_program_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_object__find_map_by_name": (_P, [_P, ctypes.c_char_p]),
    "bpf_object__next_map": (_P, [_P, _P]),
    "bpf_map__name": (ctypes.c_char_p, [_P]),
    "bpf_map__fd": (ctypes.c_int, [_P]),
    "bpf_map__initial_value": (_P, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_map__set_max_entries": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "bpf_map__set_type": (ctypes.c_int, [_P, ctypes.c_int]),
    "bpf_map__set_key_size": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "bpf_map__set_value_size": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "bpf_map__max_entries": (ctypes.c_uint32, [_P]),
    "bpf_map__key_size": (ctypes.c_uint32, [_P]),
    "bpf_map__value_size": (ctypes.c_uint32, [_P]),
    "bpf_object__next_program": (_P, [_P, _P]),
    "bpf_program__section_name": (ctypes.c_char_p, [_P]),
    "bpf_program__set_autoload": (ctypes.c_int, [_P, ctypes.c_bool]),
    "bpf_program__set_log_buf": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "bpf_program__fd": (ctypes.c_int, [_P]),
    "bpf_program__name": (ctypes.c_char_p, [_P]),
    "bpf_program__attach": (_P, [_P]),
    "bpf_program__attach_cgroup": (_P, [_P, ctypes.c_int]),
    "bpf_link__destroy": (ctypes.c_int, [_P]),
    "bpf_link__fd": (ctypes.c_int, [_P]),
    "bpf_map__reuse_fd": (ctypes.c_int, [_P, ctypes.c_int]),
    "bpf_iter_create": (ctypes.c_int, [ctypes.c_int]),
    "bpf_map_lookup_elem": (ctypes.c_int, [ctypes.c_int, _P, _P]),
    "bpf_map_update_elem": (ctypes.c_int, [ctypes.c_int, _P, _P, ctypes.c_uint64]),
    "bpf_map_delete_elem": (ctypes.c_int, [ctypes.c_int, _P]),
    "bpf_map_get_next_key": (ctypes.c_int, [ctypes.c_int, _P, _P]),
    "bpf_obj_get_info_by_fd": (ctypes.c_int, [ctypes.c_int, _P, ctypes.POINTER(ctypes.c_uint32)]),
    "bpf_enable_stats": (ctypes.c_int, [ctypes.c_int]),
    "ring_buffer__new": (_P, [ctypes.c_int, RingBufferCallback, _P, _P]),
    "ring_buffer__poll": (ctypes.c_int, [_P, ctypes.c_int]),
    "ring_buffer__consume": (ctypes.c_int, [_P]),
    "ring_buffer__free": (None, [_P]),
    "ring_buffer__epoll_fd": (ctypes.c_int, [_P]),
    # perf_buffer__new(map_fd, page_cnt, sample_cb, lost_cb, ctx, opts): the libbpf 1.0 signature
    "perf_buffer__new": (_P, [ctypes.c_int, ctypes.c_size_t, PerfSampleCallback, PerfLostCallback, _P, _P]),
    "perf_buffer__poll": (ctypes.c_int, [_P, ctypes.c_int]),
    "perf_buffer__consume": (ctypes.c_int, [_P]),
    "perf_buffer__free": (None, [_P]),
    "bpf_prog_test_run_opts": (ctypes.c_int, [ctypes.c_int, _P]),
    "bpf_prog_load": (
        ctypes.c_int,
        [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, _P, ctypes.c_size_t, _P],
    ),
    "bpf_raw_tracepoint_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int]),
    "btf__load_vmlinux_btf": (_P, []),
    "btf__parse": (_P, [ctypes.c_char_p, _P]),
    "btf__new": (_P, [_P, ctypes.c_uint32]),
    "btf__free": (None, [_P]),
    "btf__find_by_name_kind": (ctypes.c_int32, [_P, ctypes.c_char_p, ctypes.c_uint32]),
    "btf__find_by_name": (ctypes.c_int32, [_P, ctypes.c_char_p]),
    "btf__type_by_id": (_P, [_P, ctypes.c_uint32]),
    "btf__name_by_offset": (ctypes.c_char_p, [_P, ctypes.c_uint32]),
    "btf__resolve_size": (ctypes.c_int64, [_P, ctypes.c_uint32]),
    "libbpf_probe_bpf_map_type": (ctypes.c_int, [ctypes.c_int, _P]),
    "libbpf_probe_bpf_prog_type": (ctypes.c_int, [ctypes.c_int, _P]),
    "libbpf_set_print": (_P, [_P]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def open_library(soname: str, short: str) -> ctypes.CDLL:
    """The shared library `soname` (the ABI major we declare against), else whatever `short` the system
    names. The soname is tried first because ctypes.util.find_library runs `ldconfig -p` (or a compiler) in
    a subprocess: tens of milliseconds of a trace's start, spent before the probes are attached."""
    try:
        return ctypes.CDLL(soname, use_errno=True)
    except OSError:
        from ctypes.util import find_library  # only when the soname is not where the dynamic loader looks

        found = find_library(short)
        if found is None:
            raise
        return ctypes.CDLL(found, use_errno=True)


_libc = open_library("libc.so.6", "c")
_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [_P, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [_P, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAX_MESSAGES = 50


class _Captures(threading.local):
    """The message lists open on this thread, innermost last."""

    def __init__(self) -> None:
        self.stack: list[list[str]] = []


_captures = _Captures()


def _collect_message(level: int, fmt: bytes, args: int) -> int:
    # libbpf's own warnings ("failed to find BTF for ...") explain load failures; keep them for the error
    # message instead of letting them interleave with our output on stderr. Level 2 is debug: ignored.
    # libbpf prints synchronously on the thread that called it, so the capture open on *this* thread is the
    # one the message belongs to: two sessions loading at once in two threads never see each other's lines.
    # Outside any capture nobody is going to report the message, so it is dropped.
    stack = _captures.stack
    if level < 2 and stack:
        buffer = ctypes.create_string_buffer(1024)
        _libc.vsnprintf(buffer, len(buffer), fmt, args)
        messages = stack[-1]
        messages.append(buffer.value.decode(errors="replace").rstrip())
        del messages[:-_MAX_MESSAGES]
    return 0


_collect_message_c = _PrintCallback(_collect_message)


@contextmanager
def mapped_readonly(path: str) -> Iterator[tuple[int, int] | None]:
    """(address, size) of `path` mapped read-only and private for the block; None when it cannot be mapped.

    For /sys/kernel/btf/vmlinux (mappable since Linux 6.16): libbpf's btf__parse reads that file 4 KiB per
    read() (sysfs binary files give no more) into one fresh buffer and copies it into another, ~10 ms of a
    cold start; btf__new over the mapping copies the kernel's pages once. Python's mmap cannot be used: it
    exposes no address for a read-only mapping, and the kernel refuses a writable one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        size = os.fstat(fd).st_size
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0) if size else _MAP_FAILED
    finally:
        os.close(fd)
    if address in (None, _MAP_FAILED):
        yield None
        return
    try:
        yield address, size
    finally:
        _libc.munmap(address, size)


@contextmanager
def capture_messages() -> Iterator[list[str]]:
    """Collect the warnings libbpf prints on this thread inside the block into the yielded list.

    Used around each libbpf call that can fail (open, load, attach) so the error carries its own explanation.
    """
    messages: list[str] = []
    _captures.stack.append(messages)
    try:
        yield messages
    finally:
        _captures.stack.pop()


def lib() -> ctypes.CDLL:
    """The loaded libbpf, declared; raises a sentence saying what to install when it is missing."""
    global _lib
    with _lock:
        if _lib is None:
            _lib = _load()
        return _lib


def _load() -> ctypes.CDLL:
    try:
        loaded = open_library("libbpf.so.1", "bpf")
    except OSError as error:
        raise EnvironmentProblem(
            "libbpf is not installed: install it (Debian/Ubuntu: apt install libbpf1; "
            "Fedora: dnf install libbpf)"
        ) from error
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            function: Callable[..., Any] = getattr(loaded, name)
        except AttributeError as error:
            raise EnvironmentProblem(
                f"the installed libbpf is too old (it lacks {name}): netsleuth needs libbpf 1.0 or newer"
            ) from error
        function.restype = restype  # type: ignore[attr-defined]
        function.argtypes = argtypes  # type: ignore[attr-defined]
    loaded.libbpf_set_print(ctypes.cast(_collect_message_c, ctypes.c_void_p))
    return loaded
