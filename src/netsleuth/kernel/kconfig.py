"""The running kernel's build configuration (/proc/config.gz or /boot/config-RELEASE), for the few facts
BPF programs need and BTF does not carry.

Only the options asked for are looked up, in the raw text: the whole config is about ten thousand lines,
and splitting it into a dictionary would be spent on every trace's way to attaching for one or two answers.
"""

from __future__ import annotations

import functools
import os
import zlib
from pathlib import Path

__all__ = ["config_option", "kernel_config_text", "thread_size"]

_GZIP_WINDOW = 16 + zlib.MAX_WBITS  # zlib's way of saying "a gzip header and trailer around the data"


@functools.cache
def kernel_config_text(proc_config: Path = Path("/proc/config.gz"), boot: Path = Path("/boot")) -> bytes:
    """The config as the kernel was built with it; empty when neither source is available."""
    try:
        return zlib.decompress(proc_config.read_bytes(), _GZIP_WINDOW)
    except (OSError, zlib.error):
        try:
            return (boot / f"config-{os.uname().release}").read_bytes()
        except OSError:
            return b""


def config_option(name: str, text: bytes | None = None) -> str | None:
    """The value of CONFIG_`name` ("y", "m", a number, a string without its quotes); None when it is not
    set ("# CONFIG_X is not set" lines and missing options alike)."""
    config = kernel_config_text() if text is None else text
    key = f"CONFIG_{name}=".encode()
    start = 0 if config.startswith(key) else config.find(b"\n" + key)
    if start < 0:
        return None
    start = config.index(b"=", start) + 1
    end = config.find(b"\n", start)
    value = config[start : len(config) if end < 0 else end].decode(errors="replace")
    return value.strip().strip('"')


def thread_size(text: bytes | None = None) -> int:
    """THREAD_SIZE: 16 KiB on x86-64 and arm64 (4 KiB pages), doubled by KASAN (arch/x86/include/asm/
    page_64_types.h KASAN_STACK_ORDER), at least one page on 64 KiB-page arm64 kernels."""
    size = max(16384, os.sysconf("SC_PAGE_SIZE"))
    if config_option("KASAN", text) == "y":
        size *= 2
    return size
