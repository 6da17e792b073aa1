"""How `drops` chooses the older kernels' paths (no kernel needed): inferred reasons when the kernel's
skb:kfree_skb has none (the probe answered from Debian 6.1's recorded tracepoints and a reasonless one),
the NETSLEUTH_DROPS_FALLBACK words, the refusal of reason filters, and inferred records marked as such in
JSON, text and summaries."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from netsleuth.bpf import features
from netsleuth.diagnostics.drops import program
from netsleuth.diagnostics.drops.decode import decode_record
from netsleuth.diagnostics.drops.enrich import DropEnricher
from netsleuth.diagnostics.drops.program import DropsProgramConfig, drop_reasons_for_run, forced_fallbacks
from netsleuth.diagnostics.drops.view import drop_line
from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.kallsyms import Kallsyms
from netsleuth.kernel.reasons import DropReasons
from tests.unit.test_drops_decode import FIXTURES, KALLSYMS, enricher, make_event


class _Prototypes:
    """A kernel's tracepoint prototypes as the probes read them: skb:kfree_skb with `arity` arguments."""

    def __init__(self, arity: int) -> None:
        self.arity = arity

    def tracepoint_arity(self, tracepoint: str) -> int | None:
        return self.arity if tracepoint == "kfree_skb" else None


_PROBE = features.drop_reasons


def _kernel(monkeypatch: pytest.MonkeyPatch, kfree_skb_arity: int) -> None:
    monkeypatch.setattr(features, "drop_reasons", lambda: _PROBE(_Prototypes(kfree_skb_arity)))


def test_reasons_are_inferred_only_where_the_kernel_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    _kernel(monkeypatch, 2)  # 5.4 - 5.16: (skb, location)
    assert DropsProgramConfig().infers_reasons
    assert not DropsProgramConfig(kernel_reasons=True).infers_reasons
    _kernel(monkeypatch, 3)  # 5.17+
    assert not DropsProgramConfig().infers_reasons
    assert DropsProgramConfig(kernel_reasons=False).infers_reasons


def test_fallback_words(monkeypatch: pytest.MonkeyPatch) -> None:
    assert forced_fallbacks("") == {}
    assert forced_fallbacks(" perf-buffer , no-reason,raw-tp,no-task-btf") == {
        "perf_buffer": True,
        "kernel_reasons": False,
        "raw_tp_only": True,
        "current_task_btf": False,
    }
    with pytest.raises(
        UsageError, match="unknown fallback 'ring'; known: perf-buffer, no-reason, raw-tp, no-task-btf"
    ):
        forced_fallbacks("ring")
    monkeypatch.setenv(program.FALLBACK_ENV, "no-reason")
    assert forced_fallbacks() == {"kernel_reasons": False}


def test_a_kernel_without_reason_names_gets_an_empty_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_enum() -> DropReasons:
        raise EnvironmentProblem("this kernel does not name its drop reasons")

    monkeypatch.setattr("netsleuth.kernel.reasons.load_drop_reasons", no_enum)
    _kernel(monkeypatch, 2)
    assert drop_reasons_for_run().by_value == {}
    with pytest.raises(EnvironmentProblem):
        drop_reasons_for_run(kernel_reasons=True)  # asked for the kernel's reasons: still the error
    _kernel(monkeypatch, 3)
    with pytest.raises(EnvironmentProblem):
        drop_reasons_for_run()  # the tracepoint has reasons but they cannot be named: not hidden


def test_reason_filters_need_the_kernels_reasons() -> None:
    with pytest.raises(UsageError, match="inferred from where each packet was freed"):
        DropsProgramConfig(reasons=frozenset({2}), kernel_reasons=False)


def _inferring(tmp_path: Path) -> DropEnricher:
    kallsyms_file = tmp_path / "kallsyms"
    kallsyms_file.write_text(KALLSYMS)
    from netsleuth.kernel.reasons import load_drop_reasons

    reasons = load_drop_reasons(Path("/nonexistent"), [FIXTURES / "reasons" / "kfree_skb_format_6.1.txt"])
    return DropEnricher(reasons, kallsyms=Kallsyms(str(kallsyms_file)), infer_reasons=True)


def test_an_inferred_reason_comes_from_the_location_and_says_so(tmp_path: Path) -> None:
    # The program leaves `reason` 0 without reasons; the location is in tcp_v4_rcv.
    raw = decode_record(make_event(in_task=0))
    raw = dataclasses.replace(raw, reason=0)
    inferred = _inferring(tmp_path).enrich(raw)
    given = enricher(tmp_path).enrich(decode_record(make_event(in_task=0)))
    assert (inferred.reason, inferred.reason_inferred) == ("NO_SOCKET", True)
    assert (given.reason, given.reason_inferred) == ("NO_SOCKET", msgspec.UNSET)
    # The number is this kernel's for the inferred name (6.1's tracefs table here), never the 0 it carried.
    assert inferred.reason_code == given.reason_code == 2
    assert inferred.to_json()["reason_inferred"] is True and "reason_inferred" not in given.to_json()
    assert "  NO_SOCKET (inferred)  " in drop_line(inferred) and "(inferred)" not in drop_line(given)


def test_an_unlisted_location_is_not_specified_and_still_marked(tmp_path: Path) -> None:
    raw = decode_record(make_event(in_task=0))
    raw = dataclasses.replace(raw, reason=0, location=0xFFFFFFFF81300410)  # udp_queue_rcv_one_skb
    assert _inferring(tmp_path).enrich(raw).reason == "SOCKET_RCVBUFF"
    raw = dataclasses.replace(raw, location=0xFFFFFFFF81100410)  # net_rx_action: not in the table
    record = _inferring(tmp_path).enrich(raw)
    assert (record.reason, record.reason_inferred) == ("NOT_SPECIFIED", True)


def test_diagnose_says_a_reason_was_inferred_and_fixes_without_reason_filters() -> None:
    from netsleuth.diagnostics.drops.rules import drop_verdicts
    from tests.unit.test_diagnose_rules import CONTEXT, group

    given = group("IP_INHDR", 40)
    inferred = msgspec.structs.replace(given, reason_inferred=True)
    [plain] = drop_verdicts([given], CONTEXT)
    [marked] = drop_verdicts([inferred], CONTEXT)
    assert "with reason IP_INHDR at" in plain.cause and "inferred" not in plain.cause
    assert "with reason IP_INHDR (inferred from the drop location) at" in marked.cause
    assert marked.evidence["reason_inferred"] is True and "reason_inferred" not in plain.evidence
    assert any("--reason IP_INHDR" in line for line in plain.fix)
    assert not any("--reason" in line for line in marked.fix) and marked.fix
    # A rule with its own sentence says it too.
    [backlog] = drop_verdicts(
        [msgspec.structs.replace(group("CPU_BACKLOG", 1200), reason_inferred=True)], CONTEXT
    )
    assert backlog.cause.endswith("(drop reason CPU_BACKLOG inferred from the drop location)")
