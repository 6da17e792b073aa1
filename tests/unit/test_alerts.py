"""The alert path without servers: Alertmanager's webhook body, the rules' annotations, host and namespace
choice from labels, the ledger's decisions, the verdict's first line, the [alerts] config, and the shipped
rules against the metrics the agent really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from netsleuth.controller.alert_report import diagnosis_report, first_line
from netsleuth.controller.alert_state import LedgerState
from netsleuth.controller.alert_targets import choose_host, choose_netns
from netsleuth.controller.alert_webhook import (
    Alert,
    AlertRefused,
    parse_notification,
    plan_for,
)
from netsleuth.controller.config import AlertsConfig, parse_controller_config
from netsleuth.controller.requests import BadRequest
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "packaging" / "prometheus" / "netsleuth-alerts.yml"
DEFAULTS = AlertsConfig(principal="alertmanager", max_sessions=3, max_per_alert=2, max_per_host=1)

# Alertmanager 0.25's webhook body, as its notifier/webhook package writes it (version "4").
SAMPLE: dict[str, Any] = {
    "receiver": "netsleuth",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "NetsleuthPacketDrops",
                "host": "node-a",
                "instance": "10.0.0.7:9478",
                "netns": "4026532177",
                "netns_name": "web1",
                "reason": "NETFILTER_DROP",
            },
            "annotations": {
                "summary": "drops",
                "netsleuth_diagnostic": '{"diagnostic": "diagnose", "scope": "netns"}',
            },
            "startsAt": "2026-11-26T09:52:26.739266876Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=" + "x" * 3000,
            "fingerprint": "1a30ba71cca2921f",
        }
    ],
    "groupLabels": {"alertname": "NetsleuthPacketDrops"},
    "commonLabels": {"alertname": "NetsleuthPacketDrops"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "version": "4",
    "groupKey": '{}/{alertname=~"Netsleuth.+"}:{alertname="NetsleuthPacketDrops"}',
    "truncatedAlerts": 0,
}

HOSTS: list[dict[str, Any]] = [
    {
        "host": "node-a",
        "hostname": "node-a.example",
        "namespaces": [{"name": "web1", "inode": 4026532177}],
        "containers": [{"id": "3f2a9c1d0e", "netns": "web1"}],
    },
    {"host": "node-b", "hostname": "node-b", "namespaces": []},
    {"host": "lab-1", "hostname": "builder", "namespaces": []},
    {"host": "lab-2", "hostname": "builder", "namespaces": []},
]


def alert(labels: dict[str, str], annotations: dict[str, str] | None = None) -> Alert:
    return Alert("firing", {"alertname": "A", **labels}, annotations or {}, "ff", "", "")


def test_alertmanagers_body_is_read() -> None:
    notification = parse_notification(json.dumps(SAMPLE).encode())
    (first,) = notification.alerts
    assert first.name == "NetsleuthPacketDrops" and first.fingerprint == "1a30ba71cca2921f"
    assert first.labels["netns_name"] == "web1" and notification.truncated == 0
    assert notification.group_key.startswith("{}/")


def body_with(alert_changes: dict[str, Any] | None = None, **changes: Any) -> bytes:
    """SAMPLE with some top-level fields, or some fields of its one alert, changed."""
    first: dict[str, Any] = {**SAMPLE["alerts"][0], **(alert_changes or {})}
    return json.dumps({**SAMPLE, "alerts": [first], **changes}).encode()


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{", 400, "not valid JSON"),
        (b"[1]", 400, "must be a JSON object"),
        (body_with(version="3"), 400, "version \"4\" (got '3')"),
        (body_with(alerts=[]), 400, "non-empty list"),
        (body_with(alerts=[1]), 400, "alerts[0] must be an object"),
        (body_with({"status": "x"}), 400, "status"),
        (body_with({"labels": {}}), 400, "no alertname"),
        (body_with({"labels": {"alertname": 1}}), 400, "labels.alertname must be a string"),
        (body_with({"fingerprint": "a b"}), 400, "fingerprint"),
        (body_with(truncatedAlerts=-1), 400, "truncatedAlerts"),
        (b"x" * ((4 << 20) + 1), 413, "larger than 4 MiB"),
    ],
)
def test_a_bad_body_is_one_sentence(body: bytes, status: int, words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_notification(body)
    assert refused.value.status == status and words in str(refused.value)
    assert str(refused.value).endswith(".") and "\n" not in str(refused.value)


def test_the_annotation_says_what_to_run() -> None:
    annotation = '{"diagnostic": "drops", "config": {"proto": "udp"}, "scope": "host", "duration": 12}'
    plan = plan_for(alert({}, {"netsleuth_diagnostic": annotation}), DEFAULTS)
    assert (plan.diagnostic, plan.config, plan.scope, plan.duration) == (
        "drops",
        {"proto": "udp"},
        "host",
        12.0,
    )
    default = plan_for(alert({}), DEFAULTS)
    assert (default.diagnostic, default.scope, default.duration) == ("diagnose", None, 30.0)
    for text, words in [
        ("{", "is not JSON"),
        ('{"diagnostic": "drops", "scop": "host"}', "unknown key 'scop'"),
        ('{"scope": "cluster"}', "scope must be one of netns, host, *, pod, k8s_namespace"),
        ('{"config": {"netns": "other"}}', "may not name a netns"),
        ('{"duration": -1}', "duration must be a number"),
    ]:
        with pytest.raises(AlertRefused, match=re.escape(words)):
            plan_for(alert({}, {"netsleuth_diagnostic": text}), DEFAULTS)


def test_the_host_comes_from_the_host_label_then_the_instance() -> None:
    assert choose_host({"host": "node-b", "instance": "node-a:9478"}, HOSTS)["host"] == "node-b"
    assert choose_host({"instance": "node-a:9478"}, HOSTS)["host"] == "node-a"  # a host id
    assert choose_host({"instance": "node-a.example:9478"}, HOSTS)["host"] == "node-a"  # its hostname
    with pytest.raises(
        AlertRefused, match="several hosts \\(lab-1, lab-2\\); give the scrape target a host label"
    ):
        choose_host({"instance": "builder:9478"}, HOSTS)
    with pytest.raises(AlertRefused, match=re.escape("'10.9.9.9:9478' matches no registered host")):
        choose_host({"instance": "10.9.9.9:9478"}, HOSTS)
    with pytest.raises(AlertRefused, match="host label 'node-z' names no registered host"):
        choose_host({"host": "node-z"}, HOSTS)
    with pytest.raises(AlertRefused, match="no host, netsleuth_host or instance label"):
        choose_host({}, HOSTS)


def test_the_namespace_comes_from_the_labels_and_the_hosts_own_report() -> None:
    node_a = HOSTS[0]
    assert choose_netns("netns", {"netns_name": "web1"}, node_a) == "web1"
    assert choose_netns("netns", {"netns": "4026532177"}, node_a) == "web1"  # the inode, named by the host
    assert choose_netns("netns", {"container_id": "3f2a9c1d"}, node_a) == "web1"
    assert choose_netns("netns", {"netns_name": "host"}, node_a) is None  # the host's own
    assert choose_netns(None, {}, node_a) is None
    assert choose_netns("host", {"netns_name": "web1"}, node_a) is None
    assert choose_netns("*", {}, node_a) == "*"
    for labels, words in [
        ({"netns_name": "db"}, "netns 'db' is not a namespace host node-a reported"),
        ({"netns": "other"}, 'netns="other"'),
        ({"netns": "4026530000"}, "inode 4026530000 is not a named namespace"),
        ({"container_id": "beef"}, "container 'beef' is not a container host node-a reported"),
        ({}, "no netns_name, netns or container_id label"),
    ]:
        with pytest.raises(AlertRefused, match=re.escape(words)):
            choose_netns("netns", labels, node_a)
    with pytest.raises(AlertRefused, match="pod scope, which needs pod names in the host registry"):
        choose_netns("pod", {"pod": "web-0", "namespace": "team-a"}, node_a)


def outcome(state: LedgerState, fingerprint: str, alertname: str, host: str) -> str:
    refusal = state.refusal(fingerprint, alertname, host, DEFAULTS)
    return refusal[0] if refusal is not None else "start"


def test_the_ledger_dedups_and_caps() -> None:
    state = LedgerState()
    assert state.refusal("f1", "A", "h1", DEFAULTS) is None
    state.claim("f1", "A", "h1", 100.0)
    assert state.refusal("f1", "A", "h2", DEFAULTS) == (
        "duplicate",
        "it already started session (starting) within the last 3600 s (dedup_window).",
    )
    state.attach("f1", "s1")
    assert "session s1" in str(state.refusal("f1", "A", "h2", DEFAULTS))
    assert outcome(state, "f2", "B", "h1") == "rate_limited_host"
    state.claim("f2", "A", "h2", 101.0)
    assert outcome(state, "f3", "A", "h3") == "rate_limited_alert"
    state.claim("f3", "B", "h3", 102.0)
    assert outcome(state, "f4", "C", "h4") == "capped"
    # A claim whose session never started counts for nothing; one that started stays.
    state.release("f3", 103.0)
    state.release("f1", 103.0)
    assert set(state.fingerprints) == {"f1", "f2"} and len(state.starts) == 2
    # The window passes: counts empty; the dedup window (longer) still holds f1.
    state.prune(100.0 + DEFAULTS.window + 1, DEFAULTS)
    assert state.starts == [] and set(state.fingerprints) == {"f1", "f2"}
    assert outcome(state, "f1", "A", "h1") == "duplicate"
    state.prune(100.0 + DEFAULTS.dedup_window + 1, DEFAULTS)
    assert state.fingerprints == {}
    again = LedgerState.from_json(state.to_json())
    assert again == state


def snapshot(timeline: list[dict[str, Any]], verdicts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "id": "s1",
        "state": "ended",
        "diagnostic": "diagnose",
        "duration": 6.0,
        "scope": {"netns": ["web1"]},
        "hosts": {"node-a": {"state": "ended", "totals": {"total": 5}}},
        "timeline": timeline,
        "verdicts": verdicts or [],
    }


def test_the_first_line_is_the_worst_verdict() -> None:
    timeline: list[dict[str, Any]] = [
        {"type": "drop", "host": "node-a"},
        {
            "type": "verdict",
            "host": "node-a",
            "rank": 2,
            "severity": "warning",
            "category": "retransmits",
            "cause": "TCP retransmitted",
        },
        {
            "type": "verdict",
            "host": "node-a",
            "rank": 1,
            "severity": "critical",
            "category": "firewall",
            "cause": 'firewall rule "-A INPUT -j DROP" dropped 5 packet(s)',
        },
    ]
    assert first_line(snapshot(timeline)) == (
        'node-a: firewall rule "-A INPUT -j DROP" dropped 5 packet(s)',
        "firewall",
    )
    flows = [{"text": "SYN left host a -> dropped on host b", "outcome": "dropped"}]
    assert first_line(snapshot([], flows)) == ("SYN left host a -> dropped on host b", "dropped")
    assert first_line(snapshot([])) == ("no cause found: diagnose saw 5 event(s) on node-a in 6 s", "")
    failed = {**snapshot([]), "hosts": {"node-a": {"state": "failed", "reason": "not ready within 15 s"}}}
    assert first_line(failed) == ("no verdict: node-a failed: not ready within 15 s", "")
    report = diagnosis_report(alert({"host": "node-a"}).brief(), snapshot(timeline), "http://ui/#/session/s1")
    assert report["text"].startswith("A on node-a: node-a: firewall rule") and report["text"].endswith(
        "(http://ui/#/session/s1)"
    )
    assert report["hosts"] == ["node-a"] and report["cause"] == "firewall" and len(report["verdicts"]) == 2


def config(
    alerts: str,
    users: str = '[[users]]\nname = "alertmanager"\ntoken_hash = "sha256:' + "0" * 64 + '"\nroles = []\n',
) -> Any:
    text = f'[signing]\nkey_file = "{__file__}"\n{users}\n[alerts]\n{alerts}'
    import tomllib

    return parse_controller_config(tomllib.loads(text), "test", Path("/"))


def test_the_alerts_table_is_checked(tmp_path: Path) -> None:
    loaded = config('principal = "alertmanager"\nmax_sessions = 2\nnotify_url = "https://chat.example/hook/"')
    assert loaded.alerts.max_sessions == 2 and loaded.alerts.notify_url == "https://chat.example/hook"
    assert loaded.alerts.dedup_window == 3600.0 and loaded.alerts.diagnostic == "diagnose"
    token = tmp_path / "notify-token"
    token.write_text("s3cret\n")
    with_token = config(f'principal = "alertmanager"\nnotify_url = "http://x"\nnotify_token_file = "{token}"')
    assert with_token.alerts.notify_token == "s3cret" and "s3cret" not in repr(with_token.alerts)
    for text, words in [
        ('principal = "nobody"', "alerts.principal names user 'nobody', which no [[users]] entry defines"),
        ('principal = "alertmanager"\nmax_session = 2', "unknown setting alerts.max_session"),
        (
            'principal = "alertmanager"\nmax_sessions = 0',
            "alerts.max_sessions must be a whole number of at least 1",
        ),
        (
            'principal = "alertmanager"\nnotify_url = "ftp://x"',
            "alerts.notify_url must be an http:// or https:// URL",
        ),
        (
            'principal = "alertmanager"\ndiagnostic = "tcpdump"',
            "alerts.diagnostic 'tcpdump' is not a diagnostic",
        ),
        (
            'principal = "alertmanager"\nnotify_token_file = "/nonexistent"',
            "alerts.notify_token_file /nonexistent",
        ),
    ]:
        with pytest.raises(UsageError, match=re.escape(words)):
            config(text)


def exported_families() -> set[str]:
    """Every metric family name the agent's collectors write (string literals in src/netsleuth/agent and in
    the collectors the diagnostics' specs offer, diagnostics/*/collector.py)."""
    src = REPO / "src" / "netsleuth"
    names: set[str] = set()
    for path in [*(src / "agent").rglob("*.py"), *(src / "diagnostics").glob("*/collector.py")]:
        names |= set(re.findall(r'"(netsleuth_[a-z0-9_]+)"', path.read_text()))
    return names


def test_the_shipped_rules_use_metrics_the_agent_exports() -> None:
    text = RULES.read_text()
    used = set(
        re.findall(
            r"\b(netsleuth_[a-z0-9_]+)\b", "\n".join(re.findall(r"(?ms)expr: \|?(.*?)\n        for:", text))
        )
    )
    assert used, "no metric found in the rules' expressions"
    families = exported_families()
    # prometheus_client adds _total to counters; the family is named without it.
    missing = sorted(
        name for name in used if name not in families and name.removesuffix("_total") not in families
    )
    assert not missing, f"the rules use metrics the agent does not export: {missing}"


def test_every_shipped_rule_says_what_to_run() -> None:
    text = RULES.read_text()
    names = re.findall(r"- alert: (\w+)", text)
    annotations = re.findall(r"netsleuth_diagnostic: '(.*)'", text)
    assert len(names) == len(annotations) == 6
    for name, annotation in zip(names, annotations, strict=True):
        plan = plan_for(alert({}, {"netsleuth_diagnostic": annotation}), DEFAULTS)
        assert plan.diagnostic in diagnostic_names(), name
        assert plan.scope in ("netns", "host", "*"), name
        get_diagnostic(plan.diagnostic).config_from_json({**plan.config, "duration": plan.duration})
