"""Drop-reason names come from the running kernel (BTF) or its tracefs format, never from our source."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.reasons import load_drop_reasons

FIXTURES = Path(__file__).parents[1] / "fixtures" / "reasons"
NO_BTF = Path("/nonexistent/vmlinux")


def test_tracefs_format_of_an_older_kernel_gives_its_own_numbering() -> None:
    reasons = load_drop_reasons(NO_BTF, [FIXTURES / "kfree_skb_format_6.1.txt"])
    # On 6.1 NETFILTER_DROP is 7; on 6.18 it is 12: a static table would be wrong on one of them.
    assert reasons.name(7) == "NETFILTER_DROP"
    assert reasons.value("netfilter_drop") == 7
    assert reasons.value("SKB_DROP_REASON_NO_SOCKET") == 2
    assert reasons.source.startswith("tracefs")
    assert reasons.consumed is None


def test_unknown_values_are_named_not_dropped() -> None:
    reasons = load_drop_reasons(NO_BTF, [FIXTURES / "kfree_skb_format_6.1.txt"])
    assert reasons.name(999) == "UNKNOWN_999"
    assert reasons.name((3 << 16) | 5) == "SUBSYS_3_5"


def test_unknown_reason_names_the_closest_ones_not_all() -> None:
    reasons = load_drop_reasons(NO_BTF, [FIXTURES / "kfree_skb_format_6.1.txt"])
    with pytest.raises(UsageError) as caught:
        reasons.parse(["NETFILTER_DRP"])
    message = str(caught.value)
    assert message.startswith("unknown drop reason 'NETFILTER_DRP'; did you mean 'NETFILTER_DROP'")
    assert message.count("'") == 2 * 4  # the name given and at most three suggestions
    with pytest.raises(UsageError, match=r"unknown drop reason 'NOSUCH'; did you mean .*'NO_SOCKET'"):
        reasons.parse(["NOSUCH"])
    with pytest.raises(UsageError) as caught:
        reasons.parse(["CONSUMED"])  # a reason of the kernel, but not a drop: never suggested either
    assert "CONSUMED'" not in str(caught.value).split(";", 1)[1]


def test_no_source_at_all_is_an_environment_problem(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match=r"5\.17"):
        load_drop_reasons(NO_BTF, [tmp_path / "missing"])


@pytest.mark.skipif(not Path("/sys/kernel/btf/vmlinux").exists(), reason="kernel without BTF")
def test_running_kernel_btf_has_the_core_reasons() -> None:
    reasons = load_drop_reasons()
    assert reasons.source.startswith("BTF")
    for name in ("NO_SOCKET", "NETFILTER_DROP", "SOCKET_RCVBUFF", "NOT_SPECIFIED"):
        assert reasons.value(name) is not None
    assert reasons.consumed is not None  # 6.3+ has SKB_CONSUMED, which is not a drop
