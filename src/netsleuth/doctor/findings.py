"""What a rule says: a `Finding` with its evidence, a plain-words explanation, the exact commands that fix
it, the line that makes the fix survive a reboot, and the machine-applicable `FixAction`s behind --fix.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "FixAction", "FixKind", "Report", "Severity"]


class Severity(enum.Enum):
    """Ordered so that sorting puts the worst first. Its value is its label, so a typed record holding one
    (diagnose's verdict) reads "critical" in JSON, as every finding and verdict always has."""

    CRITICAL = "critical"  # packets are being lost or will be
    WARNING = "warning"  # costs throughput/latency or will bite under load
    INFO = "info"  # worth knowing; nothing is broken

    @property
    def label(self) -> str:
        return str(self.value)

    @property
    def rank(self) -> int:
        """0 for the worst: the order sorting and min() follow."""
        return _SEVERITY_ORDER[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Severity):
            return NotImplemented
        return self.rank >= other.rank


_SEVERITY_ORDER = {severity: number for number, severity in enumerate(Severity)}


class FixKind(enum.StrEnum):
    SYSCTL = "sysctl"  # target: key ("net.core.netdev_budget")
    FILE = "file"  # target: path under the root ("/proc/irq/42/smp_affinity_list")
    FEATURE = "feature"  # target: device, setting: kernel feature name ("rx-gro")
    RING = "ring"  # target: device, setting: "rx" | "tx"
    CHANNELS = "channels"  # target: device, setting: "combined_count" | "rx_count" | "tx_count"
    COALESCE = "coalesce"  # target: device, setting: struct ethtool_coalesce field
    MTU = "mtu"  # target: device


@dataclass(frozen=True)
class FixAction:
    """One change --fix may make; nothing outside the list of a finding's actions is ever touched."""

    kind: FixKind
    target: str
    value: str
    setting: str = ""

    def describe(self) -> str:
        where = f"{self.target} {self.setting}".strip()
        return f"{self.kind.value} {where} = {self.value}"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "target": self.target, "setting": self.setting, "value": self.value}

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> FixAction:
        return cls(
            kind=FixKind(raw["kind"]),
            target=raw["target"],
            setting=raw.get("setting", ""),
            value=raw["value"],
        )


@dataclass(frozen=True)
class Finding:
    id: str  # stable across runs: "<rule>:<subject>", what --fix takes
    severity: Severity
    subject: str  # the device, CPU, IRQ or setting concerned
    title: str
    evidence: dict[str, Any]
    explanation: str
    fix_commands: tuple[str, ...] = ()
    persistent: tuple[str, ...] = ()
    actions: tuple[FixAction, ...] = ()
    apply_command: str = ""  # the `netsleuth doctor [--netns NS] --fix ID --yes` line, when actions exist
    cause_code: str | None = None  # the cause's code in netsleuth.diagnostics.causes, when it has one

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.label,
            "subject": self.subject,
            "title": self.title,
            "evidence": self.evidence,
            "explanation": self.explanation,
            "fix": list(self.fix_commands),
            "persistent": list(self.persistent),
            "actions": [action.to_json() for action in self.actions],
            "apply": self.apply_command or None,
            "cause_code": self.cause_code,
        }


@dataclass(frozen=True)
class Report:
    interval: float
    findings: tuple[Finding, ...]
    all_good: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    # The NET_RX runs and NAPI polls measured with BPF over the window (napi_measure.NapiMeasurement's
    # JSON), or why they were not: the figures the time-squeeze finding was judged on.
    napi_measurement: dict[str, Any] | None = None
    napi_not_measured: str | None = None

    def finding(self, finding_id: str) -> Finding | None:
        return next((finding for finding in self.findings if finding.id == finding_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "interval_seconds": round(self.interval, 3),
            "findings": [finding.to_json() for finding in self.findings],
            "all_good": list(self.all_good),
            "notes": list(self.notes),
            "napi_measurement": self.napi_measurement,
            "napi_not_measured": self.napi_not_measured,
        }
