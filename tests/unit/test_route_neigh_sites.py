"""Where route.bpf.c recognises the packets a FAILED neighbour held: IPv6's ndisc_error_report() frees them
with a plain kfree_skb() (reason NOT_SPECIFIED), so the program is told the address ranges of the functions
that flush a failed entry's queue, read from kallsyms."""

from __future__ import annotations

from pathlib import Path

from netsleuth.diagnostics.route.session import neigh_free_sites
from netsleuth.kernel.kallsyms import Kallsyms


def test_the_ranges_of_neigh_invalidate_and_ndisc_error_report(tmp_path: Path) -> None:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text(
        "ffffffff81a00000 t neigh_invalidate\n"
        "ffffffff81a00140 T neigh_destroy\n"
        "ffffffff81b00000 t ndisc_error_report\n"
        "ffffffff81b00060 t ndisc_solicit\n"
    )
    assert neigh_free_sites(Kallsyms(str(kallsyms))) == [
        (0xFFFFFFFF81A00000, 0xFFFFFFFF81A00140),
        (0xFFFFFFFF81B00000, 0xFFFFFFFF81B00060),
    ]


def test_hidden_addresses_leave_no_site_rather_than_failing(tmp_path: Path) -> None:
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text("0000000000000000 t neigh_invalidate\n0000000000000000 T neigh_destroy\n")
    assert neigh_free_sites(Kallsyms(str(kallsyms))) == []
