"""kernel/kconfig.py: options read from a config as kernels ship it (gzip in /proc, text in /boot)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from netsleuth.kernel import kconfig

# The shape of a real config: a comment header, set options, "is not set" lines, quoted strings.
_CONFIG = b"""#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.1.0 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14) 12.2.0"
CONFIG_64BIT=y
# CONFIG_KASAN_GENERIC is not set
CONFIG_KASAN_SHADOW_OFFSET=0xdffffc0000000000
CONFIG_NR_CPUS=8192
CONFIG_DEBUG_INFO_BTF=y
CONFIG_NET_DROP_MONITOR=m
"""


def test_options_are_read_with_their_values() -> None:
    assert kconfig.config_option("64BIT", _CONFIG) == "y"
    assert kconfig.config_option("NET_DROP_MONITOR", _CONFIG) == "m"
    assert kconfig.config_option("NR_CPUS", _CONFIG) == "8192"
    assert kconfig.config_option("CC_VERSION_TEXT", _CONFIG) == "gcc (Debian 12.2.0-14) 12.2.0"


def test_a_prefix_of_another_option_is_not_that_option() -> None:
    # CONFIG_KASAN_SHADOW_OFFSET is set; CONFIG_KASAN is not, nor is the "not set" CONFIG_KASAN_GENERIC.
    assert kconfig.config_option("KASAN", _CONFIG) is None
    assert kconfig.config_option("KASAN_GENERIC", _CONFIG) is None
    assert kconfig.config_option("KASAN_SHADOW_OFFSET", _CONFIG) == "0xdffffc0000000000"


def test_first_and_last_lines_are_found() -> None:
    text = b"CONFIG_FIRST=y\nCONFIG_LAST=42"
    assert kconfig.config_option("FIRST", text) == "y"
    assert kconfig.config_option("LAST", text) == "42"


def test_thread_size_doubles_with_kasan() -> None:
    base = max(16384, os.sysconf("SC_PAGE_SIZE"))
    assert kconfig.thread_size(_CONFIG) == base
    assert kconfig.thread_size(_CONFIG + b"CONFIG_KASAN=y\n") == 2 * base


def test_proc_config_gz_then_boot_then_nothing(tmp_path: Path) -> None:
    proc = tmp_path / "config.gz"
    proc.write_bytes(gzip.compress(_CONFIG))
    assert kconfig.kernel_config_text.__wrapped__(proc, tmp_path) == _CONFIG
    (tmp_path / f"config-{os.uname().release}").write_bytes(b"CONFIG_FROM_BOOT=y\n")
    missing = tmp_path / "absent.gz"
    assert kconfig.kernel_config_text.__wrapped__(missing, tmp_path) == b"CONFIG_FROM_BOOT=y\n"
    assert kconfig.kernel_config_text.__wrapped__(missing, tmp_path / "nowhere") == b""
    proc.write_bytes(b"not gzip")  # a damaged file is "no config", not a crash
    assert kconfig.kernel_config_text.__wrapped__(proc, tmp_path / "nowhere") == b""
