"""`netsleuth resets` and `netsleuth tcp ...` as text: a line (or a few) per event, the groups' table at the
end and the exact totals."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from netsleuth.diagnostics.attribution import Owner, owner_text
from netsleuth.diagnostics.tcp.records import (
    AbortRecord,
    ConnectRecord,
    LifeRecord,
    QueueRecord,
    ResetRecord,
    RetransRecord,
    StateRecord,
    endpoint_text,
)
from netsleuth.diagnostics.tcp.reset_causes import duration_text
from netsleuth.diagnostics.tcp_names import errno_number, errno_text
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnostics.tcp.records import ResetGroup, ResetsSummary, TcpGroup, TcpRecord, TcpSummary

__all__ = [
    "ResetsView",
    "TcpView",
    "abort_line",
    "clock_text",
    "describe",
    "kind_totals_line",
    "owner_label",
    "print_reset_summary",
    "reset_line",
]


def clock_text(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds).strftime("%H:%M:%S.%f")


def owner_label(owner: Owner) -> str:
    if owner.pid is None:
        return "kernel"
    text = f"{owner.comm}[{owner.pid}]"
    if owner.container:
        text += f" container {owner.container}"
    return text


def _netns(netns: int, name: str | None) -> str:
    return f"netns {name}" if name else f"netns {netns}"


def _console() -> Console:
    from rich.console import Console

    out = sys.stdout
    return Console(file=out, width=None if out.isatty() else 200)


def kind_totals_line(label: str, totals: EventTotals, singular: str | None = None) -> str:
    """`3 resets received`; `singular` is the label for a count of exactly one."""
    text = f"{totals.matched} {singular if totals.matched == 1 and singular else label}"
    if totals.sampled:
        text += f", {totals.sampled} not printed (sampled under load; counts stay exact)"
    if totals.lost:
        text += f", {totals.lost} lost"
    if totals.ungrouped:
        text += f", {totals.ungrouped} beyond the group table (counted in the total)"
    return text


# -- resets --------------------------------------------------------------------------------------------

# The summary's reset kinds as the totals lines name them.
RESET_LABELS = {
    "sent": "resets sent by the TCP stack",
    "received": "resets received",
    "firewall": "resets sent by firewall REJECT rules",
}


def reset_line(record: ResetRecord) -> str:
    arrow = "->" if record.direction == "sent" else "<-"
    what = "RST sent" if record.direction == "sent" else "RST received"
    if record.by_firewall:
        what = "RST sent by firewall"
    parts = [
        clock_text(record.time),
        what,
        f"{record.local} {arrow} {record.remote}",
        f"state {record.state or 'no socket'}",
    ]
    if record.reason is not None:
        parts.append(f"reason {record.reason}")
    if record.trigger is not None:
        trigger = record.trigger
        inferred = " (inferred)" if trigger.inferred is True else ""
        parts.append(
            f"after [{trigger.flags}] seq {trigger.seq} ack {trigger.ack} len {trigger.len}{inferred}"
        )
    parts.append(_netns(record.netns, record.netns_name))
    parts.append(owner_label(record.owner_info))
    line = "  ".join(parts)
    line += f"\n    cause: {record.cause}"
    if isinstance(record.peer_cause, str):
        line += f"\n    peer's side: {record.peer_cause}"
    line += f"\n    check: {record.check}"
    if isinstance(record.stack, tuple):
        line += "".join(f"\n    {frame}" for frame in record.stack)
    return line


def abort_line(record: AbortRecord) -> str:
    parts = [
        clock_text(record.time),
        "aborted without RST",
        f"{record.local} -> {record.remote}",
        f"state {record.state or '?'}",
        _netns(record.netns, record.netns_name),
        owner_label(record.owner_info),
    ]
    return "  ".join(parts) + f"\n    cause: {record.cause}\n    check: {record.check}"


def labelled_totals(summary: ResetsSummary) -> dict[str, EventTotals]:
    return {label: getattr(summary, key).totals for key, label in RESET_LABELS.items()}


def print_reset_summary(
    console: Console, groups: Sequence[ResetGroup], totals: Mapping[str, EventTotals]
) -> None:
    from rich.table import Table

    table = Table(title="Resets by direction, state, reason and local end", title_justify="left")
    for column, justify in (
        ("count", "right"),
        ("direction", "left"),
        ("state", "left"),
        ("reason", "left"),
        ("local", "left"),
        ("netns", "left"),
        ("cause (example)", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for group in sorted(groups, key=lambda g: g.count, reverse=True):
        example = group.example
        if isinstance(example, ResetRecord):
            direction = "firewall" if example.by_firewall else example.direction
            reason = example.reason or "-"
        else:
            direction, reason = "abort", example.cause_code
        table.add_row(
            str(group.count),
            direction,
            example.state or "no socket",
            reason,
            example.local,
            example.netns_name or str(example.netns),
            example.cause,
        )
    if groups:
        console.print(table)
    for label, kind_totals in totals.items():
        console.print(kind_totals_line(label, kind_totals, label.replace("resets", "reset", 1)))


class ResetsView:
    """How `resets` reads on a terminal (the run loop's TextView)."""

    noun = "resets"

    def lines(self, records: Sequence[ResetRecord | AbortRecord]) -> str:
        return "".join(
            (reset_line(record) if isinstance(record, ResetRecord) else abort_line(record)) + "\n"
            for record in records
        )

    def finish(self, summary: ResetsSummary, totals: EventTotals, show_groups: bool) -> None:
        labelled = labelled_totals(summary)
        if show_groups:
            print_reset_summary(_console(), summary.groups, labelled)
            return
        for label, kind_totals in labelled.items():
            singular = label.replace("resets", "reset", 1)
            sys.stdout.write(kind_totals_line(label, kind_totals, singular) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} resets not printed (sampled), {totals.lost} lost"


# -- tcp life | states | retrans | connlat | queues ------------------------------------------------------


def describe(record: TcpRecord) -> str:
    """One line in words, for text output."""
    local, remote = endpoint_text(record.saddr, record.sport), endpoint_text(record.daddr, record.dport)
    who = owner_text(record.owner_info)
    if isinstance(record, LifeRecord):
        lived = "at least " if record.born_before_trace is True else ""  # opened before the trace
        return (
            f"{who} {local} -> {remote} lived {lived}{duration_text(record.duration_s)}, bytes_acked "
            f"{record.bytes_acked}, bytes_received {record.bytes_received}"
        )
    if isinstance(record, StateRecord):
        spent = (
            f" after {duration_text(record.previous_state_s)}" if record.previous_state_s is not None else ""
        )
        error = f" with {record.errno}" if record.errno else ""
        return f"{local} -> {remote} {record.old_state} -> {record.new_state}{spent}{error}  {who}"
    if isinstance(record, RetransRecord):
        extra = f", congestion {record.congestion_state}" if record.congestion_state else ""
        segments = f" ({record.segments} segments)" if record.segments > 1 else ""
        return (
            f"{record.kind} retransmit{segments} {local} -> {remote} in {record.state} (#{record.flow_count} "
            f"of this flow{extra})  {who}"
        )
    if isinstance(record, ConnectRecord):
        latency = duration_text(record.latency_ms / 1e3)
        if record.errno:
            return f"{who} connect {local} -> {remote} failed after {latency}: " + errno_text(
                errno_number(record.errno)
            )
        return f"{who} connect {local} -> {remote} in {latency}"
    return f"{record.what}: {record.text}\n    check: {record.check}"


_NOUNS = {
    "life": ("connection", "connections"),
    "states": ("state change", "state changes"),
    "retrans": ("retransmit", "retransmits"),
    "connlat": ("connect", "connects"),
    "queues": ("queue drop", "queue drops"),
}
_COLUMNS = {
    "life": ["count", "process", "peer or service", "netns", "mean s", "bytes_acked", "bytes_received"],
    "states": ["count", "transition", "netns", "mean s in previous"],
    "connlat": ["count", "process", "destination", "netns", "result", "mean ms", "max ms"],
    "retrans": ["count", "segments", "kind", "state", "flow", "netns", "owner"],
    "queues": ["count", "what", "reason", "socket", "netns", "owner"],
}


def _number(value: float | object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else "-"


def _group_row(group: TcpGroup) -> list[str]:
    example = group.example
    local = endpoint_text(example.saddr, example.sport)
    remote = endpoint_text(example.daddr, example.dport)
    who = owner_text(example.owner_info)
    netns = example.netns_name or str(example.netns)
    count = str(group.count)
    if isinstance(example, LifeRecord):
        where = local if example.side == "server" else remote
        return [
            count,
            who,
            where,
            netns,
            _number(group.mean_duration_s),
            str(group.bytes_acked),
            str(group.bytes_received),
        ]
    if isinstance(example, StateRecord):
        # A socket's first state has no measured predecessor (the sum stays 0): nothing to average.
        mean = _number(group.mean_previous_state_s) if group.mean_previous_state_s else "-"
        return [count, f"{example.old_state} -> {example.new_state}", netns, mean]
    if isinstance(example, ConnectRecord):
        result = example.errno or "ok"
        return [
            count,
            who,
            remote,
            netns,
            result,
            _number(group.mean_latency_ms),
            _number(group.max_latency_ms),
        ]
    if isinstance(example, RetransRecord):
        segments = str(group.segments) if isinstance(group.segments, int) else "-"
        return [count, segments, example.kind, str(example.state), f"{local} -> {remote}", netns, who]
    assert isinstance(example, QueueRecord)
    return [count, example.what, example.reason or "-", local, netns, who]


class TcpView:
    """How one `tcp` view reads on a terminal (the run loop's TextView)."""

    def __init__(self, subcommand: str) -> None:
        self._name = subcommand
        self._singular, self.noun = _NOUNS[subcommand]

    def lines(self, records: Sequence[TcpRecord]) -> str:
        return "".join(f"{clock_text(record.time)}  {describe(record)}\n" for record in records)

    def finish(self, summary: TcpSummary, totals: EventTotals, show_groups: bool) -> None:
        console = _console()
        if summary.groups and show_groups:
            from rich.table import Table

            table = Table(title=f"tcp {self._name}", title_justify="left")
            for column in _COLUMNS[self._name]:
                right = column in ("count", "segments", "mean s", "max ms", "mean ms")
                table.add_column(column, justify="right" if right else "left")
            for group in summary.groups:
                table.add_row(*_group_row(group))
            console.print(table)
        if isinstance(summary.netstat, dict) and summary.netstat:
            grown = {key: value for key, value in summary.netstat.items() if value}
            console.print(
                "TcpExt counters during the trace: "
                + (", ".join(f"{key} +{value}" for key, value in grown.items()) or "no change")
            )
        sys.stdout.write(kind_totals_line(self.noun, totals, self._singular) + "\n")
        if self._name == "retrans" and show_groups:
            sys.stdout.write(f"{summary.segments} retransmitted segments (TcpRetransSegs counts segments)\n")

    def loss_line(self, totals: EventTotals) -> str:
        return f"{totals.sampled} not printed (sampled), {totals.lost} lost"
