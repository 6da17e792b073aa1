"""--fix and rollback on a fixture root (sysctl and file actions), the rendering, and the CLI's exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from netsleuth.cli import main
from netsleuth.doctor import apply as apply_module
from netsleuth.doctor.apply import apply_fix, rollback
from netsleuth.doctor.findings import Finding, FixAction, FixKind, Severity
from netsleuth.doctor.render import render_json, render_text
from netsleuth.doctor.rules import diagnose
from netsleuth.errors import EnvironmentProblem, UsageError
from tests.fixtures.doctor import scenario_root, scenario_window


def _irq_finding(tmp_path: Path) -> tuple[Path, Finding]:
    root = scenario_root("irq-cpu3", "after", tmp_path)
    finding = diagnose(scenario_window("irq-cpu3", tmp_path)).finding("irq-pileup:eth0")
    assert finding is not None
    return root, finding


def test_fix_writes_rollback_first_and_rollback_restores_exactly(tmp_path: Path) -> None:
    root, finding = _irq_finding(tmp_path)
    untouched = root / "proc/irq/72/smp_affinity_list"
    untouched_before = untouched.read_text()
    rollback_file = apply_fix(finding, rollback_dir=tmp_path / "rb", root=root)
    document = json.loads(rollback_file.read_text())
    assert document["finding"] == "irq-pileup:eth0"
    assert {change["previous"] for change in document["changes"]} == {"3"}
    assert (root / "proc/irq/65/smp_affinity_list").read_text() == "1\n"
    assert untouched.read_text() == untouched_before  # the link vector was not named: not touched
    restored = rollback(rollback_file)
    assert len(restored) == 8
    for irq in range(64, 72):
        assert (root / f"proc/irq/{irq}/smp_affinity_list").read_text().strip() == "3"


def test_sysctl_fix_and_rollback(tmp_path: Path) -> None:
    root = scenario_root("budget-squeeze", "after", tmp_path)
    finding = diagnose(scenario_window("budget-squeeze", tmp_path)).finding("time-squeeze")
    assert finding is not None
    budget = root / "proc/sys/net/core/netdev_budget"
    rollback_file = apply_fix(finding, rollback_dir=tmp_path / "rb", root=root)
    assert budget.read_text() == "600\n"
    rollback(rollback_file)
    assert budget.read_text() == "300\n"


def _two_file_finding() -> Finding:
    return Finding(
        id="test:x",
        severity=Severity.INFO,
        subject="x",
        title="x",
        evidence={},
        explanation="x",
        fix_commands=("echo 2 > /a", "echo 2 > /b"),
        actions=(FixAction(FixKind.FILE, "/a", "2"), FixAction(FixKind.FILE, "/b", "2")),
    )


def test_failed_action_undoes_the_earlier_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").write_text("1\n")
    (tmp_path / "b").write_text("1\n")
    real_write = apply_module._write

    def failing_write(action: FixAction, value: str, root: Path) -> None:
        if action.target == "/b" and value == "2":
            raise OSError("device busy")
        real_write(action, value, root)

    monkeypatch.setattr(apply_module, "_write", failing_write)
    with pytest.raises(EnvironmentProblem, match="earlier changes undone"):
        apply_fix(_two_file_finding(), rollback_dir=tmp_path / "rb", root=tmp_path)
    assert (tmp_path / "a").read_text() == "1\n"


def test_unreadable_target_stops_before_any_change(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("1\n")
    with pytest.raises(EnvironmentProblem, match="before changing it"):
        apply_fix(_two_file_finding(), rollback_dir=tmp_path / "rb", root=tmp_path)  # /b is missing
    assert (tmp_path / "a").read_text() == "1\n" and not (tmp_path / "rb").exists()


def test_action_the_finding_does_not_name_is_refused(tmp_path: Path) -> None:
    finding = Finding(
        id="test:y",
        severity=Severity.INFO,
        subject="y",
        title="y",
        evidence={},
        explanation="y",
        fix_commands=("sysctl -w net.core.somaxconn=1",),
        actions=(FixAction(FixKind.SYSCTL, "net.ipv4.ip_forward", "1"),),
    )
    with pytest.raises(EnvironmentProblem, match="does not name"):
        apply_fix(finding, rollback_dir=tmp_path, root=tmp_path)


def test_rollback_of_a_bad_file_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError):
        rollback(tmp_path / "bad.json")
    with pytest.raises(UsageError):
        rollback(tmp_path / "missing.json")


def test_text_groups_by_severity_and_lists_all_good(tmp_path: Path) -> None:
    report = diagnose(scenario_window("conntrack", tmp_path))
    buffer = io.StringIO()
    render_text(report, Console(file=buffer, width=200, color_system=None))
    text = buffer.getvalue()
    assert text.index("CRITICAL (1)") < text.index("WARNING (1)") < text.index("All good")
    assert "[conntrack-full]" in text and "fix: sysctl -w net.netfilter.nf_conntrack_max=524288" in text
    assert "✓ RX rings" in text


def test_json_is_one_object(tmp_path: Path) -> None:
    report = diagnose(scenario_window("ring-512", tmp_path))
    payload = json.loads(render_json(report))
    assert payload["interval_seconds"] == 2.0
    (finding,) = payload["findings"]
    assert finding["id"] == "ring-exhaustion:eth0" and finding["severity"] == "critical"
    assert finding["actions"] == [{"kind": "ring", "target": "eth0", "setting": "rx", "value": "2048"}]


def _record(tmp_path: Path, scenario: str) -> Path:
    window = scenario_window(scenario, tmp_path)
    bundle = tmp_path / f"{scenario}-bundle"
    bundle.mkdir()
    (bundle / "before.json").write_text(json.dumps(window.before.to_json()))
    (bundle / "after.json").write_text(json.dumps(window.after.to_json()))
    return bundle


def test_cli_replay_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _record(tmp_path, "irq-cpu3")
    assert main(["doctor", "--replay", str(bundle), "--json"]) == 0
    ids = {finding["id"] for finding in json.loads(capsys.readouterr().out)["findings"]}
    assert ids == {"irq-pileup:eth0", "softirq-skew:cpu3"}


def test_cli_fix_without_yes_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _record(tmp_path, "ring-512")
    assert main(["doctor", "--replay", str(bundle), "--fix", "ring-exhaustion:eth0"]) == 0
    out = capsys.readouterr().out
    assert "would run: ethtool -G eth0 rx 2048" in out and "Nothing changed" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--replay", "BUNDLE", "--fix", "no-such:finding"],
        ["doctor", "--replay", "BUNDLE", "--fix", "softirq-skew:cpu3"],  # advice only, nothing to apply
        ["doctor", "--interval", "0"],
        ["doctor", "--replay", "/nonexistent"],
        ["offload", "show", "no-such-dev0"],
        ["offload", "set", "no-such-dev0", "gro", "on"],
        ["offload", "set", "lo", "gro", "sideways"],
        ["rollback", "/nonexistent.json"],
    ],
)
def test_cli_bad_input_exits_2(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bundle = _record(tmp_path, "irq-cpu3")
    argv = [str(bundle) if arg == "BUNDLE" else arg for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(argv))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
