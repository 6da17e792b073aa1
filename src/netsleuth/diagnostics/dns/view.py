"""`netsleuth dns` as text: one line per answer, timeout, late answer or drop; the summary table."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsleuth.diagnostics.dns.records import DnsAnswer, DnsDrop, DnsTimeout
from netsleuth.diagnostics.totals import EventTotals

if TYPE_CHECKING:
    from rich.console import Console

    from netsleuth.diagnostics.dns.records import DnsQuery, DnsRecord, DnsSummary, DnsUnmatched

__all__ = ["DnsView", "dns_line", "dns_lines", "dns_totals_line", "events_line", "print_dns_summary"]


def _clock(seconds: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(seconds)) + f".{int(seconds % 1 * 1e6):06d}"


def _who(facts: DnsQuery) -> str:
    who = f"{facts.comm}[{facts.pid}]" if facts.pid else facts.comm
    if facts.container:
        who += f" container {facts.container}"
    netns = facts.netns_name or str(facts.netns)
    return f"{who} netns {netns}"


def _server(facts: DnsQuery) -> str:
    server = f"[{facts.server}]" if ":" in facts.server else facts.server
    return f"{facts.proto} {server}:{facts.server_port}"


def _answer_line(record: DnsAnswer) -> str:
    extra = []
    if record.truncated:
        extra.append("TRUNCATED")
    if record.tcp_retry:
        extra.append("tcp retry of a truncated answer")
    if record.retransmits:
        extra.append(f"{record.retransmits} retransmit(s)")
    shown = ", ".join(record.answers[:3]) + (" ..." if len(record.answers) > 3 else "")
    return (
        f"{_clock(record.time)}  {record.rcode:<8} {record.latency_ms:8.3f} ms  {record.name} {record.qtype}"
        f"  -> {_server(record)}  {_who(record)}  answers {record.answer_count}"
        + (f" [{shown}]" if shown else "")
        + (f"  ({'; '.join(extra)})" if extra else "")
    )


def _timeout_line(record: DnsTimeout) -> str:
    arrived = (
        f", the answer arrived after {record.answer_arrived_ms:.3f} ms" if record.answer_arrived_ms else ""
    )
    return (
        f"{_clock(record.time)}  TIMEOUT  {record.waited_ms:8.0f} ms  {record.name} {record.qtype}"
        f"  -> {_server(record)}  {_who(record)}\n    cause: {record.cause}{arrived}"
    )


def _unmatched_line(record: DnsUnmatched) -> str:
    what = "late answer (after its timeout)" if record.late else "answer with no query seen"
    who = f"{record.comm}[{record.pid}]" if record.pid else record.comm
    return f"{_clock(record.time)}  {record.rcode:<8} {what}: {record.name} from {record.server} to {who}"


def _drop_line(record: DnsDrop) -> str:
    return (
        f"{_clock(record.time)}  DROP     {record.direction} {record.name or ''} id {record.id}"
        f"  {record.proto} {record.saddr}:{record.sport} > {record.daddr}:{record.dport}"
        f"  {record.cause}"
    )


def dns_line(record: DnsRecord) -> str:
    if isinstance(record, DnsAnswer):
        return _answer_line(record)
    if isinstance(record, DnsTimeout):
        return _timeout_line(record)
    if isinstance(record, DnsDrop):
        return _drop_line(record)
    return _unmatched_line(record)


def dns_lines(records: Sequence[DnsRecord]) -> str:
    return "".join(dns_line(record) + "\n" for record in records)


def dns_totals_line(summary: DnsSummary) -> str:
    return (
        f"{summary.queries} queries, {summary.answers} answers, {summary.timeouts} timeouts, "
        f"{summary.unmatched} unmatched answers, {summary.dns_drops} DNS packets dropped, "
        f"{summary.retransmits} retransmits; {_filtered(summary.filtered)}{events_line(summary.totals)}"
    )


def _filtered(count: int) -> str:
    return f"{count} answers filtered out (--rcode/--slow), " if count else ""


def events_line(totals: EventTotals) -> str:
    return (
        f"{totals.emitted} shown, {totals.sampled} sampled, {totals.lost} lost, {totals.ungrouped} ungrouped"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_dns_summary(console: Console, summary: DnsSummary) -> None:
    from rich.table import Table

    table = Table(title="DNS by process, server and name suffix")
    for column in ("queries", "process", "server", "suffix", "answers", "timeouts", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right" if column in ("queries", "timeouts") else "left")
    table.add_column("amplification")
    table.add_column("tc/tcp")
    for row in summary.rows:
        process = f"{row.comm}[{row.pid}]" if row.pid else row.comm
        answers = " ".join(f"{name} {count}" for name, count in sorted(row.answers.items()))
        amplification = (
            f"x{row.amplification:.1f} ({row.search_expansions} search-list queries)"
            if row.amplification and row.search_expansions
            else "-"
        )
        table.add_row(
            str(row.queries),
            process,
            row.server,
            row.suffix,
            answers or "-",
            str(row.timeouts),
            _ms(row.p50_ms),
            _ms(row.p99_ms),
            amplification,
            f"{row.truncated}/{row.tcp_queries}",
        )
    console.print(table)
    console.print(dns_totals_line(summary))


class DnsView:
    """How `dns` reads on a terminal (the run loop's TextView)."""

    noun = "DNS answers"

    def lines(self, records: Sequence[DnsRecord]) -> str:
        return dns_lines(records)

    def finish(self, summary: DnsSummary, totals: EventTotals, show_groups: bool) -> None:
        from rich.console import Console

        out = sys.stdout
        if show_groups:
            print_dns_summary(Console(file=out, width=None if out.isatty() else 200), summary)
        else:
            out.write(dns_totals_line(summary) + "\n")

    def loss_line(self, totals: EventTotals) -> str:
        return events_line(totals)
