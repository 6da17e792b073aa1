"""Which diagnostics a host can run, and in words why not the others: each diagnostic's `needs` (its spec)
and every agent session's (the CPU budget's run-time accounting) against what a host's agent probed.

The hosts below are what probe_all() reports on kinds of host a fleet meets, written from the kernel history
the probes cite (netsleuth.bpf.features); this host's own probes are checked against the same vocabulary.
"""

from __future__ import annotations

from typing import Any

import pytest

from netsleuth.bpf import features
from netsleuth.diagnostics.registry import DIAGNOSTIC_MODULES, get_diagnostic
from netsleuth.fleet.host_support import SupportTable, diagnostic_needs

# A 6.x kernel with BTF, run as root: everything netsleuth probes, but fentry and kprobes (this VM's kernel is
# built without CONFIG_FUNCTION_TRACER and CONFIG_KPROBES), and no diagnostic needs those.
MODERN: dict[str, Any] = {
    "kernel": "6.18.44",
    "can_trace": True,
    "btf": True,
    "ring_buffer": True,
    "tp_btf": True,
    "raw_tp": True,
    "fentry": False,
    "kprobes": False,
    "drop_reasons": True,
    "kfree_skb_rx_sk": True,
    "consume_skb_location": True,
    "reset_reasons": True,
    "retransmit_err": True,
    "perf_event_profiling": True,
    "cgroup_v2": "/sys/fs/cgroup",
    "bpf_stats": True,
}
# Linux 5.4 built with BTF: raw tracepoints (4.17) but no tp_btf or fentry (5.5), no ring buffers (5.8), none
# of the newer tracepoint arguments; BPF_ENABLE_STATS came in 5.8 too, so accounting is on only because its
# administrator set kernel.bpf_stats_enabled=1 (5.1).
LINUX_5_4 = {
    **MODERN,
    "kernel": "5.4.0",
    "ring_buffer": False,
    "tp_btf": False,
    "fentry": False,
    "drop_reasons": False,
    "kfree_skb_rx_sk": False,
    "consume_skb_location": False,
    "reset_reasons": False,
    "retransmit_err": False,
}
RING_BUFFER_USERS = {"dns", "route", "snoop.exec", "snoop.open", "softirq", "profile"}
ALL = tuple(DIAGNOSTIC_MODULES)


def _cannot(found: dict[str, Any], names: tuple[str, ...] = ALL) -> dict[str, list[str]]:
    answers = SupportTable(diagnostic_needs()).of(found, names)
    assert [entry["diagnostic"] for entry in answers] == list(names)
    return {entry["diagnostic"]: entry["why"] for entry in answers if entry["runs"] is not True}


def test_every_diagnostic_says_what_it_needs_in_the_probes_vocabulary() -> None:
    known = set(features.feature_names())
    for name in ALL:
        needs = get_diagnostic(name).needs
        # Every built-in diagnostic loads BPF programs, so it needs at least the privileges and BTF.
        assert {"can_trace", "btf"} <= set(needs), name
        assert set(needs) <= known, (name, set(needs) - known)
        assert set(diagnostic_needs()[name]) == {*needs, "bpf_stats"}  # and every agent session's


def test_this_hosts_probes_report_exactly_that_vocabulary() -> None:
    assert set(features.probe_all()) - {"kernel"} == set(features.feature_names())


def test_a_modern_host_runs_every_diagnostic() -> None:
    answers = SupportTable(diagnostic_needs()).of(MODERN, ALL)
    assert all(entry["runs"] is True and entry["why"] == [] for entry in answers), answers


def test_a_5_4_kernel_runs_what_does_without_ring_buffers_and_says_why_not_the_rest() -> None:
    cannot = _cannot(LINUX_5_4)
    assert set(cannot) == RING_BUFFER_USERS
    for why in cannot.values():
        assert why == ["this kernel lacks BPF ring buffers (needs Linux 5.8 or newer)"]


def test_without_run_time_accounting_the_agent_runs_nothing_and_says_how_to_fix_it() -> None:
    cannot = _cannot({**LINUX_5_4, "bpf_stats": False})
    assert set(cannot) == set(ALL)
    accounting = (
        "BPF run-time accounting is off and the agent cannot turn it on: give it CAP_SYS_ADMIN "
        "(BPF_ENABLE_STATS, Linux 5.8 or newer) or set kernel.bpf_stats_enabled=1"
    )
    assert cannot["drops"] == [accounting]
    assert cannot["profile"] == ["this kernel lacks BPF ring buffers (needs Linux 5.8 or newer)", accounting]


def test_an_agent_without_privileges_is_told_that_once_not_as_every_probe_it_could_not_run() -> None:
    # probe_all() loads nothing without privileges: the program types, ring buffers and accounting read False.
    unprivileged = {
        **MODERN,
        **dict.fromkeys(("can_trace", "ring_buffer", "tp_btf", "raw_tp", "bpf_stats"), False),
    }
    cannot = _cannot(unprivileged)
    assert set(cannot) == set(ALL)
    assert set(map(tuple, cannot.values())) == {
        (
            "the agent may not load BPF programs: run it as root, or with CAP_BPF, CAP_PERFMON and "
            "CAP_NET_ADMIN",
        )
    }


def test_a_kernel_without_btf_is_told_that_once() -> None:
    # Linux 4.19 without BTF: probe_all() does not look for typed tracepoints or their arguments.
    no_btf = {**LINUX_5_4, "btf": False, "kernel": "4.19.0"}
    cannot = _cannot(no_btf)
    assert set(cannot) == set(ALL)
    assert cannot["drops"] == [
        "this kernel lacks kernel BTF (/sys/kernel/btf/vmlinux) (needs Linux 5.4 built with "
        "CONFIG_DEBUG_INFO_BTF=y or newer); use a distribution kernel that ships BTF"
    ]
    assert cannot["profile"][0].startswith("this kernel lacks kernel BTF")


@pytest.mark.parametrize(
    ("found", "names", "why"),
    [
        (
            {key: value for key, value in MODERN.items() if key != "perf_event_profiling"},
            ("profile",),
            "the agent does not report whether it has perf_event_profiling (an older agent)",
        ),
        ({"error": "libbpf.so.1 is missing"}, ("drops",), "the agent could not probe its kernel: libbpf"),
        (MODERN, ("nosuch.plugin",), "this controller does not know what nosuch.plugin needs"),
    ],
)
def test_what_cannot_be_told_is_said_so(found: dict[str, Any], names: tuple[str, ...], why: str) -> None:
    (answer,) = SupportTable(diagnostic_needs()).of(found, names)
    assert answer["runs"] is None
    assert answer["why"][0].startswith(why), answer
