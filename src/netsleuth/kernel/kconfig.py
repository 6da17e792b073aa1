"""The running kernel's build configuration (/proc/config.gz or /boot/config-RELEASE), for the few facts
BPF programs need and BTF does not carry."""

from __future__ import annotations

import functools
import gzip
import os
from pathlib import Path

__all__ = ["kernel_config", "thread_size"]


@functools.cache
def kernel_config(proc_config: Path = Path("/proc/config.gz"), boot: Path = Path("/boot")) -> dict[str, str]:
    """CONFIG_* options as name -> value ("y", "m", a number...); empty when the config is not available."""
    text = ""
    try:
        text = gzip.decompress(proc_config.read_bytes()).decode(errors="replace")
    except OSError:
        try:
            text = (boot / f"config-{os.uname().release}").read_text(errors="replace")
        except OSError:
            return {}
    options: dict[str, str] = {}
    for line in text.splitlines():
        name, equals, value = line.partition("=")
        if equals and name.startswith("CONFIG_"):
            options[name] = value.strip('"')
    return options


def thread_size(config: dict[str, str] | None = None) -> int:
    """THREAD_SIZE: 16 KiB on x86-64 and arm64 (4 KiB pages), doubled by KASAN (arch/x86/include/asm/
    page_64_types.h KASAN_STACK_ORDER), at least one page on 64 KiB-page arm64 kernels."""
    options = kernel_config() if config is None else config
    size = max(16384, os.sysconf("SC_PAGE_SIZE"))
    if options.get("CONFIG_KASAN") == "y":
        size *= 2
    return size
