"""Verdicts from a `dns` watch: timeouts (with the drop behind them on this host), SERVFAIL/REFUSED from a
server, NXDOMAIN storms, and search-list amplification with its fix.

Inputs are the typed records of netsleuth.diagnostics.dns (a timeout already carries the drop of its query
or answer that the dns programs saw: a firewall rule, a full receive buffer) and the summary rows; pure
functions, so they run on recorded records.

One fault, one verdict:
- verdicts group by what a person would change, the program and the name or cause, not by process: a cron
  job running `getent` every minute is one verdict that says how many processes it saw;
- the DNS packets a fault dropped are evidence of the timeout verdict they caused (`dns_drops`), never a
  verdict of their own; only drops that no timeout of the same cause followed make a `dns-drop` verdict;
- the firewall verdict the drops object makes of the same packets (same rule, same namespace) is absorbed
  into the DNS verdict by diagnose (netsleuth.diagnose.correlate, with `dropped_by_rule`): the rule is the
  cause, the DNS timeouts its effect.

`diagnose_verdicts` is dns's part of `diagnose` (its spec's DiagnoseWatch).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netsleuth.diagnostics.dns.records import (
    DnsAnswer,
    DnsDrop,
    DnsQuery,
    DnsRecord,
    DnsRow,
    DnsSummary,
    DnsTimeout,
)
from netsleuth.firewall.removal import removal_command
from netsleuth.spec.diagnose import Watched, WatchInputs, Window
from netsleuth.spec.verdict import Severity, Verdict

if TYPE_CHECKING:
    from netsleuth.diagnostics.dns.session import DnsDiagnostic

__all__ = [
    "KEEP_RECORDS",
    "NXDOMAIN_STORM_MIN",
    "diagnose_verdicts",
    "dns_verdicts",
    "dropped_by_rule",
    "open_watch",
]

NXDOMAIN_STORM_MIN = 20  # NXDOMAIN answers to one program in the window before it is called a storm
_NXDOMAIN_STORM_SHARE = 0.5  # ... and at least this share of its answers
_AMPLIFICATION_MIN = 2.0
_RCVBUF_REASONS = ("SOCKET_RCVBUFF", "UDP_RCVBUFF")
# A search domain of a Kubernetes pod's resolv.conf: <namespace>.svc.<cluster domain>, svc.<...>, <...>.
_KUBERNETES_SEARCH = ".svc."


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _who(comm: str, pids: Iterable[int | None]) -> str:
    """The program as a person would name it: `getent[812]`, or `getent (3 processes)` when several
    processes of it did the same."""
    known = sorted({pid for pid in pids if pid})
    if len(known) == 1:
        return f"{comm}[{known[0]}]"
    if not known:
        return comm
    return f"{comm} ({len(known)} processes)"


def _processes(owners: Iterable[tuple[int | None, str]]) -> list[dict[str, Any]]:
    return [{"pid": pid, "comm": comm} for pid, comm in sorted({(p or 0, c) for p, c in owners})]


def _server(facts: DnsQuery) -> str:
    return f"{facts.server}:{facts.server_port}/{facts.proto}"


def _names(names: Iterable[str | None], limit: int = 5) -> list[str]:
    return [name for name, _ in Counter(name for name in names if name).most_common(limit)]


def _firewall_fix(drop: DnsDrop) -> list[str]:
    removal = removal_command(drop.netfilter or {}, drop.netns_name)
    if removal is not None:
        return [removal + "   # if DNS answers should pass"]
    where = drop.netns_name or drop.netns
    return [f"allow udp/tcp port 53 through the {drop.hook or 'firewall'} hook (netns {where})"]


# -- what dropped DNS packets, and which drops belong together ---------------------------------------------


@dataclass(frozen=True)
class _DropCause:
    """What a person would change about a dropped DNS packet: the rule (or reason) in its namespace, for
    queries or answers of one program."""

    reason: str
    rule: str | None
    direction: str
    netns: int
    comm: str

    @staticmethod
    def of(drop: DnsDrop, comm: str) -> _DropCause:
        return _DropCause(drop.reason, drop.rule, drop.direction, drop.netns, comm)


def _drop_key(drop: DnsDrop) -> tuple[Any, ...]:
    return (drop.time, drop.reason, drop.id, drop.saddr, drop.sport, drop.daddr, drop.dport)


def _asker(drop: DnsDrop, timeouts_by_query: dict[tuple[Any, ...], DnsTimeout]) -> str:
    """The program a dropped packet was for: its socket's owner, else the process whose query it was."""
    if drop.pid:
        return drop.comm
    timeout = timeouts_by_query.get(_query_of(drop))
    return timeout.comm if timeout is not None else drop.comm


def _query_of(drop: DnsDrop) -> tuple[Any, ...]:
    """(client, client port, server, id): the query a dropped query or answer belongs to."""
    if drop.direction == "query":
        return (drop.saddr, drop.sport, drop.daddr, drop.id)
    return (drop.daddr, drop.dport, drop.saddr, drop.id)


def _all_drops(records: Sequence[DnsRecord]) -> list[DnsDrop]:
    """Every dropped DNS packet seen once: the drop records and the drops timeouts carry (a drop outside
    --netns is no record, only a timeout's cause)."""
    drops: dict[tuple[Any, ...], DnsDrop] = {}
    for record in records:
        found = record if isinstance(record, DnsDrop) else getattr(record, "drop", None)
        if isinstance(found, DnsDrop):
            drops.setdefault(_drop_key(found), found)
    return list(drops.values())


# -- timeouts ------------------------------------------------------------------------------------------------


def _timeout_verdict(timeouts: list[DnsTimeout], dropped: list[DnsDrop], seconds: float) -> Verdict:
    first = timeouts[0]
    facts, drop = first, first.drop
    who = _who(facts.comm, (timeout.pid for timeout in timeouts))
    where = _server(facts)
    queries = _plural(len(timeouts), "DNS query", "DNS queries")
    evidence: dict[str, Any] = {
        "timeouts": len(timeouts),
        "rate_per_s": round(len(timeouts) / seconds, 2) if seconds else None,
        "names": _names(timeout.name for timeout in timeouts),
        "server": where,
        "example": f"{facts.name} {facts.qtype} from {facts.client}:{facts.client_port} id {facts.id}",
        "processes": _processes((t.pid, t.comm) for t in timeouts),
        "netns": facts.netns_name or facts.netns,
    }
    if drop is not None:
        evidence["drop"] = drop.to_json()
        # Every packet this cause dropped for the program: the retries' too, each of which also timed out.
        evidence["dns_drops"] = len(dropped)
    # The lookup's flow, in the namespace of the drop behind it (where its fix goes) or of the client.
    place: dict[str, Any] = {
        "events": len(timeouts),
        "netns": drop.netns if drop is not None else facts.netns,
        "saddr": _address(facts.client),
        "daddr": _address(facts.server),
    }
    if drop is not None and drop.rule:
        return Verdict(
            category="dns-timeout-firewall",
            severity=Severity.CRITICAL,
            cause=f"{queries} of {who} to {where} timed out: the {drop.direction}s are dropped by firewall "
            f'rule "{drop.rule}" ({drop.hook} hook, netns {drop.netns_name or drop.netns}), '
            f"{_plural(len(dropped), 'packet', 'packets')} in all",
            evidence=evidence,
            fix=(*_firewall_fix(drop), "or point the resolver at a server the firewall lets through"),
            cause_code="firewall_drop",
            firewall_rule=drop.rule,
            **place,
        )
    if drop is not None and drop.reason in _RCVBUF_REASONS:
        return Verdict(
            category="dns-timeout-rcvbuf",
            severity=Severity.CRITICAL,
            cause=f"{_plural(len(timeouts), 'DNS answer', 'DNS answers')} from {where} reached {who} but "
            "were dropped: its socket's receive buffer was full, so the lookups timed out",
            evidence=evidence,
            fix=(
                f"make {facts.comm} read its DNS socket faster (fewer queries in flight)",
                "or give the socket a larger SO_RCVBUF (net.core.rmem_default / rmem_max bound it)",
            ),
            cause_code="rcvbuf",
            **place,
        )
    if drop is not None:
        return Verdict(
            category="dns-timeout-drop",
            severity=Severity.CRITICAL,
            cause=f"{queries} of {who} to {where} timed out: the kernel dropped the {drop.direction}s "
            f"({drop.reason} at {drop.location})",
            evidence=evidence,
            fix=(f"netsleuth drops --reason {drop.reason} --port 53   # the full path of each drop",),
            cause_code="kernel_drop",
            **place,
        )
    return Verdict(
        category="dns-timeout",
        severity=Severity.WARNING,
        cause=f"{queries} of {who} to {where} got no answer within {first.waited_ms / 1000:.1f} s, and "
        "nothing on this host dropped them: the loss is on the path or at the server",
        evidence=evidence,
        fix=(
            f"dig @{facts.server} {facts.name} {facts.qtype}   # does the server answer at all?",
            "check the server's load and logs, and drops on the path (netsleuth diagnose on its host)",
        ),
        cause_code="dns_no_answer",
        **place,
    )


def _timeout_and_drop_verdicts(
    timeouts: Sequence[DnsTimeout], drops: Sequence[DnsDrop], seconds: float
) -> list[Verdict]:
    by_query = {(t.client, t.client_port, t.server, t.id): t for t in timeouts}
    dropped: dict[_DropCause, list[DnsDrop]] = defaultdict(list)
    for drop in drops:
        dropped[_DropCause.of(drop, _asker(drop, by_query))].append(drop)
    groups: dict[tuple[Any, ...], list[DnsTimeout]] = defaultdict(list)
    causes: dict[tuple[Any, ...], _DropCause | None] = {}
    for timeout in timeouts:
        cause = _DropCause.of(timeout.drop, timeout.comm) if timeout.drop is not None else None
        key = (timeout.comm, timeout.server, timeout.server_port, timeout.proto, cause)
        groups[key].append(timeout)
        causes[key] = cause
    verdicts = []
    explained: set[_DropCause] = set()
    for key, timed_out in groups.items():
        cause = causes[key]
        verdicts.append(_timeout_verdict(timed_out, dropped.get(cause, []) if cause else [], seconds))
        if cause is not None:
            explained.add(cause)
    for cause, unexplained in dropped.items():
        if cause not in explained:
            verdicts.append(_drop_verdict(unexplained, seconds))
    return verdicts


def _packet_text(drop: DnsDrop) -> str:
    return (
        f"{drop.proto} {drop.saddr}:{drop.sport} > {drop.daddr}:{drop.dport} "
        f"id {drop.id} {drop.name or ''}".rstrip()
    )


def _drop_verdict(group: list[DnsDrop], seconds: float) -> Verdict:
    """DNS packets dropped on this host that no timeout of the same cause followed in the window: the
    resolver's retry got through, or the window ended before its timeout."""
    first = group[0]
    evidence: dict[str, Any] = {
        "dns_drops": len(group),
        "rate_per_s": round(len(group) / seconds, 2) if seconds else None,
        "names": _names(drop.name for drop in group),
        "example": _packet_text(first),
        "drop": first.to_json(),
        "processes": _processes((drop.pid, drop.comm) for drop in group if drop.pid),
    }
    if first.rule:
        fix, code = (*_firewall_fix(first),), "firewall_drop"
    elif first.reason in _RCVBUF_REASONS:
        fix = (f"make {first.comm} read its DNS socket faster, or give it a larger SO_RCVBUF",)
        code = "rcvbuf"
    else:
        fix = (f"netsleuth drops --reason {first.reason} --port 53   # the full path of each drop",)
        code = "kernel_drop"
    packets = _plural(len(group), f"DNS {first.direction}", f"DNS {first.direction}s")
    return Verdict(
        category="dns-drop",
        severity=Severity.CRITICAL if first.rule or first.reason in _RCVBUF_REASONS else Severity.WARNING,
        cause=f"{packets} {first.cause.split(' ', 1)[1]}; no lookup timed out in the window for them: a "
        "resolver retry got through, each after a retry interval (seconds), or the window ended first",
        evidence=evidence,
        fix=fix,
        events=len(group),
        cause_code=code,
        netns=first.netns,
        saddr=_address(first.saddr),
        daddr=_address(first.daddr),
        firewall_rule=first.rule,
    )


# -- answers -----------------------------------------------------------------------------------------------


def _server_failure_verdicts(answers: Sequence[DnsAnswer], seconds: float) -> list[Verdict]:
    failed: dict[tuple[str, int, str], list[DnsAnswer]] = defaultdict(list)
    for answer in answers:
        if answer.rcode in ("SERVFAIL", "REFUSED"):
            failed[(answer.server, answer.server_port, answer.rcode)].append(answer)
    verdicts = []
    for (server, port, rcode), group in failed.items():
        names = _names(answer.name for answer in group)
        evidence = {
            "answers": len(group),
            "rate_per_s": round(len(group) / seconds, 2) if seconds else None,
            "names": names,
            "processes": _processes((a.pid, a.comm) for a in group),
        }
        queries = _plural(len(group), "query", "queries")
        if rcode == "SERVFAIL":
            cause = (
                f"DNS server {server}:{port} answered SERVFAIL to {queries} (e.g. {names[0]}): it could not "
                "resolve them (upstream unreachable, DNSSEC failure, or a broken zone)"
            )
            fix: tuple[str, ...] = (
                f"dig @{server} {names[0]} +dnssec +trace   # where resolution fails",
                "check that server's upstreams and logs; point clients at a healthy resolver meanwhile",
            )
        else:
            cause = (
                f"DNS server {server}:{port} REFUSED {queries} (e.g. {names[0]}): it does not serve these "
                "clients or this zone (recursion or ACL)"
            )
            fix = (
                "allow these clients in the server's ACL / enable recursion for them",
                "or configure the clients with a resolver that serves them (resolv.conf nameserver)",
            )
        verdicts.append(
            Verdict(
                category=f"dns-{rcode.lower()}",
                severity=Severity.WARNING,
                cause=cause,
                evidence=evidence,
                fix=fix,
                events=len(group),
                cause_code=f"dns_{rcode.lower()}",
                netns=group[0].netns,
                daddr=_address(server),  # the server that failed them, whoever asked
            )
        )
    return verdicts


def _by_program(rows: Iterable[DnsRow]) -> dict[str, list[DnsRow]]:
    programs: dict[str, list[DnsRow]] = defaultdict(list)
    for row in rows:
        programs[row.comm].append(row)
    return programs


def _nxdomain_verdicts(rows: Sequence[DnsRow], seconds: float, netns: int | None) -> list[Verdict]:
    """NXDOMAIN for names the application itself asked for (search-list expansions have their own verdict),
    per program: the names it looks up are what to fix, however many processes ran it."""
    verdicts = []
    for comm, program_rows in _by_program(rows).items():
        answered = sum(sum(row.answers.values()) for row in program_rows)
        nxdomain = sum(row.answers.get("NXDOMAIN", 0) for row in program_rows)
        own = nxdomain - sum(row.search_expansions for row in program_rows)
        if own < NXDOMAIN_STORM_MIN or own < _NXDOMAIN_STORM_SHARE * answered:
            continue
        failing: Counter[str] = Counter()
        for row in program_rows:
            failing[row.suffix] += row.answers.get("NXDOMAIN", 0)
        suffixes = [suffix for suffix, _ in sorted(failing.items(), key=lambda item: (-item[1], item[0]))]
        verdicts.append(
            Verdict(
                category="dns-nxdomain-storm",
                severity=Severity.WARNING,
                cause=f"{_who(comm, (row.pid for row in program_rows))} got {own} NXDOMAIN answers "
                f"({own / seconds:.1f}/s) for names that do not exist, e.g. under {', '.join(suffixes[:3])}",
                evidence={
                    "nxdomain": own,
                    "answers": answered,
                    "suffixes": suffixes[:10],
                    "processes": _processes((row.pid, row.comm) for row in program_rows),
                },
                fix=(
                    f"fix the names {comm} looks up (a typo, a stale config, a deleted service)",
                    "a caching resolver (nscd, systemd-resolved, NodeLocal DNSCache) keeps the repeats off "
                    "the server",
                ),
                events=own,
                cause_code="dns_nxdomain",
                netns=netns,
            )
        )
    return verdicts


def _amplification_verdicts(rows: Sequence[DnsRow], netns: int | None) -> list[Verdict]:
    """One verdict per program, name and server, whatever the number of processes: the fix (a fully
    qualified name, fewer ndots) is made once, in the program's config or resolv.conf."""
    together: dict[tuple[str, str, tuple[str, ...]], list[DnsRow]] = defaultdict(list)
    for row in rows:
        if row.amplification is not None and row.amplification >= _AMPLIFICATION_MIN:
            together[(row.comm, row.server, tuple(sorted(row.names)) or (row.suffix,))].append(row)
    verdicts = []
    for (comm, server, names), group in together.items():
        lookups = sum(row.lookups for row in group)
        expansions = sum(row.search_expansions for row in group)
        queries = sum(row.queries for row in group)
        domains = sorted(set().union(*(row.search_domains for row in group)))
        name = names[0]
        tried = ", ".join(f"{name}.{domain}" for domain in domains[:4]) + (
            ", ..." if len(domains) > 4 else ""
        )
        amplification = (lookups + expansions) / lookups
        fix = [
            f"look up the fully qualified name with a trailing dot: {name}.",
            "or lower ndots (resolv.conf `options ndots:1`)",
        ]
        if any(_KUBERNETES_SEARCH in f".{domain}." for domain in domains):
            # Only where the search list is a Kubernetes pod's: `<ns>.svc.<cluster domain>` and its parents.
            fix[1] += "; in Kubernetes, the pod's dnsConfig.options ndots"
        verdicts.append(
            Verdict(
                category="dns-search-amplification",
                severity=Severity.WARNING,
                cause=f"each lookup of {name} by {_who(comm, (row.pid for row in group))} becomes "
                f"{amplification:.1f} DNS queries: the resolver tries the search list first "
                f"({tried or 'its search domains'} answered NXDOMAIN: {expansions} expansion(s) in "
                f"{lookups} lookup(s)), because the name has fewer dots than ndots",
                evidence={
                    "lookups": lookups,
                    "expansions": expansions,
                    "queries": queries,
                    "server": server,
                    "names": list(names[:5]),
                    "search_domains": domains,
                    "processes": _processes((row.pid, row.comm) for row in group),
                },
                fix=tuple(fix),
                events=expansions,
                cause_code="dns_search_amplification",
                netns=netns,
                daddr=_address(server),
            )
        )
    return verdicts


def dns_verdicts(
    records: Sequence[DnsRecord], rows: Sequence[DnsRow], seconds: float, netns: int | None = None
) -> list[Verdict]:
    """Every DNS verdict of one watch: `records` from a DnsDiagnostic in event mode, `rows` its summary;
    `netns` the one namespace the watch was kept to, if it was (the summary rows do not say theirs)."""
    timeouts = [record for record in records if isinstance(record, DnsTimeout)]
    answers = [record for record in records if isinstance(record, DnsAnswer)]
    return [
        *_timeout_and_drop_verdicts(timeouts, _all_drops(records), seconds),
        *_server_failure_verdicts(answers, seconds),
        *_nxdomain_verdicts(rows, seconds, netns),
        *_amplification_verdicts(rows, netns),
    ]


KEEP_RECORDS = 10_000  # enough evidence for any verdict; a storm's rest is in the kernel's counts


def open_watch(inputs: WatchInputs) -> DnsDiagnostic:
    """The dns programs for diagnose's window. Only what a verdict needs reaches Python: SERVFAIL/REFUSED
    answers (filtered in the kernel), timeouts (the pending-table sweep) and dropped DNS packets; every other
    answer is only counted in the kernel's groups, which the search-list and NXDOMAIN rules read at the
    end."""
    from netsleuth.diagnostics.dns.records import TIMEOUT_RCODE, DnsConfig
    from netsleuth.diagnostics.dns.session import DnsDiagnostic

    # A query unanswered for half the window (at most the resolver default of 5 s) is a timeout.
    timeout = min(5.0, max(0.5, inputs.duration / 2))
    config = DnsConfig(rcode=("SERVFAIL", "REFUSED", TIMEOUT_RCODE), timeout=timeout)
    # diagnose's own filter, already resolved on this host, stands for the config's packet filters.
    return DnsDiagnostic(config, inputs.context, packet_filter=inputs.packet_filter)


def diagnose_verdicts(watched: Watched, window: Window) -> list[Verdict]:
    """dns's part of `diagnose`: its verdicts from the records kept over the window and its summary."""
    summary: DnsSummary = watched.summary
    return dns_verdicts(watched.records, summary.rows, window.seconds, window.watched_netns)


def dropped_by_rule(records: Sequence[DnsRecord]) -> Counter[tuple[str, int]]:
    """DNS packets each firewall rule dropped, by (rule, namespace): how diagnose tells a firewall verdict
    that is only this DNS fault from one whose rule also dropped other traffic."""
    return Counter((drop.rule, drop.netns) for drop in _all_drops(records) if drop.rule)


def _address(text: str | None) -> str | None:
    """An address field's value: the text of one address ("?" is what the kernel could not read)."""
    return text if text and text != "?" else None
