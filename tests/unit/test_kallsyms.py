"""Kallsyms on a recorded excerpt of a 6.18 x86-64 /proc/kallsyms (plus module and BPF lines in the kernel's
`\\t[module]` format), and a smoke test against the live file when it is readable."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.kallsyms import Kallsyms, KernelSymbol, default_kallsyms

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
TCP_V4_RCV = 0xFFFFFFFF820938B0


@pytest.fixture
def kallsyms() -> Kallsyms:
    return Kallsyms(str(FIXTURES / "kallsyms.txt"))


def test_resolves_function_with_offset_and_size(kallsyms: Kallsyms) -> None:
    symbol = kallsyms.resolve(TCP_V4_RCV + 0x2A)
    assert symbol == KernelSymbol("tcp_v4_rcv", TCP_V4_RCV, 0x2A, 0xFFFFFFFF82094CB0 - TCP_V4_RCV, None)
    assert kallsyms.format(TCP_V4_RCV + 0x2A) == "tcp_v4_rcv+0x2a"
    assert kallsyms.format(TCP_V4_RCV) == "tcp_v4_rcv+0x0"


def test_last_byte_and_padding_prefix(kallsyms: Kallsyms) -> None:
    # The byte before __pfx_tcp4_proc_exit still belongs to tcp_v4_rcv; the prefix is its own symbol.
    assert kallsyms.format(0xFFFFFFFF82094CAF) == "tcp_v4_rcv+0x13ff"
    assert kallsyms.format(0xFFFFFFFF82094CB4) == "__pfx_tcp4_proc_exit+0x4"


def test_aliases_resolve_to_first_listed(kallsyms: Kallsyms) -> None:
    symbol = kallsyms.resolve(0xFFFFFFFF81000008)
    assert symbol is not None
    assert (symbol.name, symbol.offset, symbol.size) == ("srso_alias_untrain_ret", 8, 0x10)


def test_module_symbols_carry_their_module(kallsyms: Kallsyms) -> None:
    assert kallsyms.format(0xFFFFFFFFC0A03010 + 0x44) == "nft_do_chain+0x44 [nf_tables]"
    assert kallsyms.format(0xFFFFFFFFC0B12000 + 0x10) == "bpf_prog_6deef7357e7b4530_sd_devices+0x10 [bpf]"
    # The module's last text symbol has nothing after it in the same module: size unknown, still resolves.
    last = kallsyms.resolve(0xFFFFFFFFC0A03410 + 0x20)
    assert last is not None and last.size is None and last.module == "nf_tables"


def test_data_symbols_are_ignored(kallsyms: Kallsyms) -> None:
    assert kallsyms.address_of("nft_chain_policy") is None
    assert kallsyms.address_of("__start_rodata") is None


def test_unknown_addresses_print_as_hex(kallsyms: Kallsyms) -> None:
    assert kallsyms.resolve(0x1000) is None
    assert kallsyms.format(0x1000) == "0x1000"
    # Past _etext is not code; past a module's last function by more than the bound is not either.
    assert kallsyms.format(0xFFFFFFFF82276508 + 0x10) == "0xffffffff82276518"
    assert kallsyms.resolve(0xFFFFFFFFC0B12000 + 0x100000) is None


def test_address_of_prefers_core_kernel(kallsyms: Kallsyms) -> None:
    assert kallsyms.address_of("tcp_v4_rcv") == TCP_V4_RCV
    assert kallsyms.address_of("set_p4d") == 0xFFFFFFFF81200420
    assert kallsyms.address_of("set_p4d", module="veth") == 0xFFFFFFFFC0800400
    assert kallsyms.address_of("veth_xmit") == 0xFFFFFFFFC0800010
    assert kallsyms.address_of("no_such_function") is None


def test_symbols_named_lists_duplicates_in_order(kallsyms: Kallsyms) -> None:
    duplicates = kallsyms.symbols_named("set_p4d")
    assert [symbol.address for symbol in duplicates] == [0xFFFFFFFF81200420, 0xFFFFFFFF81212AB0]
    assert [symbol.size for symbol in duplicates] == [0x30, 0x30]
    assert [symbol.address for symbol in kallsyms.symbols_named("set_p4d", module="veth")] == [
        0xFFFFFFFFC0800400
    ]
    aliased = kallsyms.symbols_named("_text")
    assert [(symbol.name, symbol.address) for symbol in aliased] == [("_text", 0xFFFFFFFF81000000)]


def test_restricted_addresses_explain_the_fix() -> None:
    with pytest.raises(EnvironmentProblem, match=r"run netsleuth as root.*kptr_restrict"):
        Kallsyms(str(FIXTURES / "kallsyms-restricted.txt")).resolve(TCP_V4_RCV)


def test_missing_file_is_an_environment_problem(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="cannot read kernel symbols"):
        Kallsyms(str(tmp_path / "absent")).load()
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(EnvironmentProblem, match="no kernel text symbols"):
        Kallsyms(str(empty)).load()


def test_load_is_lazy(tmp_path: Path) -> None:
    path = tmp_path / "kallsyms"
    lazy = Kallsyms(str(path))  # constructing reads nothing, so a missing file cannot fail yet...
    # ...and the file is read at the first lookup: written only now, it is what that lookup sees.
    path.write_bytes((FIXTURES / "kallsyms.txt").read_bytes())
    assert lazy.format(TCP_V4_RCV + 0x2A) == "tcp_v4_rcv+0x2a"
    # Read once: later changes to the file are not re-read (the process shares one instance).
    path.write_text("")
    assert lazy.address_of("tcp_v4_rcv") == TCP_V4_RCV


def test_default_is_shared() -> None:
    assert default_kallsyms() is default_kallsyms()


def _live_kallsyms_readable() -> bool:
    try:
        with open("/proc/kallsyms") as live:
            return any(not line.startswith("0000000000000000") for line in [live.readline()])
    except OSError:
        return False


@pytest.mark.skipif(not _live_kallsyms_readable(), reason="/proc/kallsyms hides addresses (needs root)")
def test_live_kallsyms_loads_and_round_trips() -> None:
    # How long the load takes is measured in bench/kallsyms_load.py, against reading the file alone.
    live = Kallsyms()
    live.load()
    assert len(live) > 10_000
    address = live.address_of("tcp_v4_rcv")
    assert address is not None
    assert live.format(address + 4) == "tcp_v4_rcv+0x4"
