"""Verdicts from a `dns` watch: timeouts (with the drop behind them on this host), SERVFAIL/REFUSED from a
server, NXDOMAIN storms, and search-list amplification with its fix.

Inputs are the typed records of netsleuth.diagnostics.dns (a timeout already carries the drop of its query
or answer that the dns programs saw: a firewall rule, a full receive buffer) and the summary rows; pure
functions, so they run on recorded records.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from netsleuth.diagnose.verdicts import Severity, Verdict
from netsleuth.diagnostics.dns_records import DnsAnswer, DnsDrop, DnsQueryFacts, DnsRecord, DnsTimeout
from netsleuth.diagnostics.dns_summary import DnsSummaryRow
from netsleuth.netns_command import in_netns

__all__ = ["NXDOMAIN_STORM_MIN", "dns_verdicts"]

NXDOMAIN_STORM_MIN = 20  # NXDOMAIN answers to one process in the window before it is called a storm
_NXDOMAIN_STORM_SHARE = 0.5  # ... and at least this share of its answers
_AMPLIFICATION_MIN = 2.0
_RCVBUF_REASONS = ("SOCKET_RCVBUFF", "UDP_RCVBUFF")


def _process(facts: DnsQueryFacts) -> str:
    owner = facts.owner
    return f"{owner.comm}[{owner.pid}]" if owner.pid else owner.comm


def _server(facts: DnsQueryFacts) -> str:
    return f"{facts.server}:{facts.server_port}/{facts.proto}"


def _names(facts: Iterable[DnsQueryFacts], limit: int = 5) -> list[str]:
    return [name for name, _ in Counter(f.name for f in facts).most_common(limit)]


def _firewall_fix(drop: DnsDrop) -> list[str]:
    netfilter = drop.netfilter or {}
    netns = drop.netns_name
    table, chain = netfilter.get("table"), netfilter.get("chain")
    if netfilter.get("backend", "").startswith("iptables") and netfilter.get("rule_number") is not None:
        tool = "ip6tables" if netfilter.get("family") == "ip6" else "iptables"
        if netfilter.get("backend") == "iptables-legacy":
            tool += "-legacy"
        command = f"{tool} -t {table} -D {chain} {netfilter['rule_number']}"
        return [in_netns(command, netns) + "   # if DNS answers should pass"]
    if netfilter.get("handle") is not None:
        command = f"nft delete rule {netfilter.get('family')} {table} {chain} handle {netfilter['handle']}"
        return [in_netns(command, netns) + "   # if DNS answers should pass"]
    return [f"allow udp/tcp port 53 through the {drop.hook or 'firewall'} hook (netns {netns or drop.netns})"]


def _timeout_verdict(timeouts: list[DnsTimeout], seconds: float) -> Verdict:
    first = timeouts[0]
    facts, drop = first.query, first.drop
    evidence: dict[str, Any] = {
        "timeouts": len(timeouts),
        "rate_per_s": round(len(timeouts) / seconds, 2) if seconds else None,
        "names": _names(t.query for t in timeouts),
        "server": _server(facts),
        "example": f"{facts.name} {facts.qtype} from {facts.client}:{facts.client_port} id {facts.id}",
        "process": {"pid": facts.owner.pid, "comm": facts.owner.comm},
        "netns": facts.netns_name or facts.netns,
    }
    who, where = _process(facts), _server(facts)
    if drop is not None:
        evidence["drop"] = drop.to_json()
    if drop is not None and drop.rule:
        return Verdict(
            "dns-timeout-firewall",
            Severity.CRITICAL,
            f"{len(timeouts)} DNS quer{'y' if len(timeouts) == 1 else 'ies'} of {who} to {where} timed out: "
            f'the {drop.direction}s are dropped by firewall rule "{drop.rule}" ({drop.hook} hook, '
            f"netns {drop.netns_name or drop.netns})",
            evidence,
            (*_firewall_fix(drop), "or point the resolver at a server the firewall lets through"),
            len(timeouts),
        )
    if drop is not None and drop.reason in _RCVBUF_REASONS:
        owner = drop.owner
        target = f"{owner.comm}[{owner.pid}]" if owner.pid else who
        return Verdict(
            "dns-timeout-rcvbuf",
            Severity.CRITICAL,
            f"{len(timeouts)} DNS answer(s) from {where} reached {target} but were dropped: its socket's "
            "receive buffer was full, so the lookups timed out",
            evidence,
            (
                f"make {owner.comm or 'the process'} read its DNS socket faster (fewer queries in flight)",
                "or give the socket a larger SO_RCVBUF (net.core.rmem_default / rmem_max bound it)",
            ),
            len(timeouts),
        )
    if drop is not None:
        return Verdict(
            "dns-timeout-drop",
            Severity.CRITICAL,
            f"{len(timeouts)} DNS quer{'y' if len(timeouts) == 1 else 'ies'} of {who} to {where} timed out: "
            f"the kernel dropped the {drop.direction} ({drop.reason} at {drop.location})",
            evidence,
            (f"netsleuth drops --reason {drop.reason} --port 53   # the full path of each drop",),
            len(timeouts),
        )
    return Verdict(
        "dns-timeout",
        Severity.WARNING,
        f"{len(timeouts)} DNS quer{'y' if len(timeouts) == 1 else 'ies'} of {who} to {where} got no answer "
        f"within {first.waited_ms / 1000:.1f} s, and nothing on this host dropped them: the loss is on the "
        "path or at the server",
        evidence,
        (
            f"dig @{facts.server} {facts.name} {facts.qtype}   # does the server answer at all?",
            "check the server's load and logs, and drops on the path (netsleuth diagnose on its host)",
        ),
        len(timeouts),
    )


def _timeout_verdicts(timeouts: Sequence[DnsTimeout], seconds: float) -> list[Verdict]:
    groups: dict[tuple[Any, ...], list[DnsTimeout]] = defaultdict(list)
    for timeout in timeouts:
        facts, drop = timeout.query, timeout.drop
        cause = (drop.reason, drop.rule, drop.direction) if drop is not None else None
        groups[(facts.owner.pid, facts.owner.comm, facts.server, facts.proto, cause)].append(timeout)
    return [_timeout_verdict(group, seconds) for group in groups.values()]


def _packet_text(drop: DnsDrop) -> str:
    packet = drop.packet
    return (
        f"{packet.proto_name} {packet.saddr}:{packet.sport} > {packet.daddr}:{packet.dport} "
        f"id {drop.id} {drop.name or ''}".rstrip()
    )


def _drop_key(drop: DnsDrop) -> tuple[Any, ...]:
    packet = drop.packet
    return (drop.time, drop.reason, drop.id, packet.saddr, packet.sport, packet.daddr, packet.dport)


def _drop_verdicts(drops: Sequence[DnsDrop], timeouts: Sequence[DnsTimeout], seconds: float) -> list[Verdict]:
    """DNS packets dropped on this host that no timeout explains (yet): the resolver may have retried and
    got through, but each such drop cost the application a retry interval."""
    explained = {_drop_key(timeout.drop) for timeout in timeouts if timeout.drop is not None}
    groups: dict[tuple[Any, ...], list[DnsDrop]] = defaultdict(list)
    for drop in drops:
        if _drop_key(drop) not in explained:
            groups[(drop.direction, drop.reason, drop.rule, drop.owner.pid, drop.netns)].append(drop)
    verdicts = []
    for group in groups.values():
        first = group[0]
        evidence = {
            "drops": len(group),
            "rate_per_s": round(len(group) / seconds, 2) if seconds else None,
            "names": [name for name, _ in Counter(d.name for d in group if d.name).most_common(5)],
            "example": _packet_text(first),
            "drop": first.to_json(),
        }
        if first.owner.pid:
            evidence["process"] = {"pid": first.owner.pid, "comm": first.owner.comm}
        if first.rule:
            fix = (*_firewall_fix(first),)
        elif first.reason in _RCVBUF_REASONS:
            fix = (f"make {first.owner.comm} read its DNS socket faster, or give it a larger SO_RCVBUF",)
        else:
            fix = (f"netsleuth drops --reason {first.reason} --port 53   # the full path of each drop",)
        verdicts.append(
            Verdict(
                "dns-drop",
                Severity.CRITICAL if first.rule or first.reason in _RCVBUF_REASONS else Severity.WARNING,
                f"{len(group)} DNS {first.direction}(s) {first.cause().split(' ', 1)[1]}: each costs the "
                "asking process a resolver retry (seconds)",
                evidence,
                fix,
                len(group),
            )
        )
    return verdicts


def _server_failure_verdicts(answers: Sequence[DnsAnswer], seconds: float) -> list[Verdict]:
    failed: dict[tuple[str, int, str], list[DnsAnswer]] = defaultdict(list)
    for answer in answers:
        if answer.rcode in ("SERVFAIL", "REFUSED"):
            failed[(answer.query.server, answer.query.server_port, answer.rcode)].append(answer)
    verdicts = []
    for (server, port, rcode), group in failed.items():
        names = _names(answer.query for answer in group)
        processes = sorted({_process(answer.query) for answer in group})
        evidence = {
            "answers": len(group),
            "rate_per_s": round(len(group) / seconds, 2) if seconds else None,
            "names": names,
            "processes": processes,
        }
        if rcode == "SERVFAIL":
            cause = (
                f"DNS server {server}:{port} answered SERVFAIL to {len(group)} quer(ies) (e.g. {names[0]}): "
                "it could not resolve them (upstream unreachable, DNSSEC failure, or a broken zone)"
            )
            fix: tuple[str, ...] = (
                f"dig @{server} {names[0]} +dnssec +trace   # where resolution fails",
                "check that server's upstreams and logs; point clients at a healthy resolver meanwhile",
            )
        else:
            cause = (
                f"DNS server {server}:{port} REFUSED {len(group)} quer(ies) (e.g. {names[0]}): it does not "
                "serve these clients or this zone (recursion or ACL)"
            )
            fix = (
                "allow these clients in the server's ACL / enable recursion for them",
                "or configure the clients with a resolver that serves them (resolv.conf nameserver)",
            )
        verdicts.append(Verdict(f"dns-{rcode.lower()}", Severity.WARNING, cause, evidence, fix, len(group)))
    return verdicts


def _nxdomain_verdicts(rows: Sequence[DnsSummaryRow], seconds: float) -> list[Verdict]:
    """NXDOMAIN for names the application itself asked for (search-list expansions have their own verdict)."""
    by_process: dict[tuple[int | None, str], list[DnsSummaryRow]] = defaultdict(list)
    for row in rows:
        by_process[(row.pid, row.comm)].append(row)
    verdicts = []
    for (pid, comm), process_rows in by_process.items():
        answered = sum(sum(row.answers.values()) for row in process_rows)
        nxdomain = sum(row.answers.get("NXDOMAIN", 0) for row in process_rows)
        own = nxdomain - sum(row.expansions for row in process_rows)
        if own < NXDOMAIN_STORM_MIN or own < _NXDOMAIN_STORM_SHARE * answered:
            continue
        who = f"{comm}[{pid}]" if pid else comm
        suffixes = [row.suffix for row in sorted(process_rows, key=lambda r: -r.answers.get("NXDOMAIN", 0))]
        verdicts.append(
            Verdict(
                "dns-nxdomain-storm",
                Severity.WARNING,
                f"{who} got {own} NXDOMAIN answers ({own / seconds:.1f}/s) for names that do not exist, "
                f"e.g. under {', '.join(suffixes[:3])}",
                {"nxdomain": own, "answers": answered, "suffixes": suffixes[:10]},
                (
                    f"fix the names {comm} looks up (a typo, a stale config, a deleted service)",
                    "a caching resolver (nscd, systemd-resolved, NodeLocal DNSCache) keeps the repeats off "
                    "the server",
                ),
                own,
            )
        )
    return verdicts


def _amplification_verdicts(rows: Sequence[DnsSummaryRow]) -> list[Verdict]:
    verdicts = []
    for row in rows:
        amplification = row.amplification
        if amplification is None or amplification < _AMPLIFICATION_MIN:
            continue
        who = f"{row.comm}[{row.pid}]" if row.pid else row.comm
        name = sorted(row.names)[0] if row.names else row.suffix
        verdicts.append(
            Verdict(
                "dns-search-amplification",
                Severity.WARNING,
                f"each lookup of {name} by {who} becomes {amplification:.1f} DNS queries: the resolver tries "
                f"the search list first ({row.expansions} expansion(s) answered NXDOMAIN in "
                f"{row.lookups} lookup(s)), because the name has fewer dots than ndots",
                {
                    "lookups": row.lookups,
                    "expansions": row.expansions,
                    "queries": row.queries,
                    "server": row.server,
                    "names": sorted(row.names)[:5],
                },
                (
                    f"look up the fully qualified name with a trailing dot: {name}.",
                    "or lower ndots (resolv.conf `options ndots:1`; Kubernetes: dnsConfig.options ndots)",
                    "or the full name the search list would reach (<name>.<namespace>.svc.cluster.local)",
                ),
                row.expansions,
            )
        )
    return verdicts


def dns_verdicts(
    records: Sequence[DnsRecord], rows: Sequence[DnsSummaryRow], seconds: float
) -> list[Verdict]:
    """Every DNS verdict of one watch: `records` from a DnsDiagnostic in event mode, `rows` its summary."""
    timeouts = [record for record in records if isinstance(record, DnsTimeout)]
    answers = [record for record in records if isinstance(record, DnsAnswer)]
    drops = [record for record in records if isinstance(record, DnsDrop)]
    return [
        *_timeout_verdicts(timeouts, seconds),
        *_drop_verdicts(drops, timeouts, seconds),
        *_server_failure_verdicts(answers, seconds),
        *_nxdomain_verdicts(rows, seconds),
        *_amplification_verdicts(rows),
    ]
