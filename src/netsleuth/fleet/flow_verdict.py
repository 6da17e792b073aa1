"""One flow's verdict across hosts: its hops (what each host saw, the NATs on its path, the packets that
skipped one), told in causal order (causal_order.py), and a first line naming what the application saw,
the hop where it began and the cause.

Pure: the merge (merge.py) hands over the flow's observations - each on the host that sent it -, its NAT
path, when each NAT happened, each host's conntrack INVALID counts, the client's own report and each host's
clock uncertainty; nothing here reads a clock or a socket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple, NatHop, NatPath
from netsleuth.firewall.removal import removal_command
from netsleuth.fleet.causal_order import causal_order
from netsleuth.netns_command import in_netns
from netsleuth.packet import endpoint_text
from netsleuth.spec.records import iso_second

__all__ = [
    "AppView",
    "Hop",
    "Observation",
    "flow_verdict",
    "group_observations",
    "iso_from_ns",
    "reply_bypass_hops",
    "skipped_nat_hops",
]

# What the application saw, from the client's own `conn` report (its outcome), in the words of a verdict.
_APP_OUTCOMES = {
    "reset": "reset",
    "refused": "refused",
    "timeout": "timeout",
    "abandoned": "timeout",  # the application gave up connecting: to it, a timeout
    "failed": "failed",
    "closed": "closed",
    "open": "open",
    "pending": "open",
}
# Segments conntrack can find INVALID for their sequence numbers only: the flags are a valid combination for
# an ESTABLISHED entry, so tcp_in_window (net/netfilter/nf_conntrack_proto_tcp.c) is what refused them -
# a bad checksum is ruled out by the socket that answered it (tcp_v4_rcv checks it before any reset).
_WINDOW_ONLY_FLAGS = frozenset({"ACK", "ACK|PSH", "PSH|ACK"})
_FAULTS = ("bypass", "drop", "reset")


def iso_from_ns(ns: int) -> str:
    """UTC, to the microsecond: `2026-11-26T23:40:56.123456+00:00`. The date and time to the second come from
    a cache: a session's records fall within a few seconds, and a 10,000-host session's merge formats
    hundreds of thousands of these (a datetime each was a fifth of its verdicts' time)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return f"{iso_second(seconds)}.{rest // 1000:06d}+00:00"


@dataclass(slots=True)
class Observation:
    """One thing one host saw of one flow, on the controller's clock; `host` is the host that sent it."""

    host: str
    time_ns: int
    flow: FlowTuple  # the packet (or the connection, client -> server) as the host saw it
    kind: str  # sent | established | accepted | drop | reset | retransmit
    text: str  # the hop's words, naming the host
    what: str = ""  # the same without the host (for the verdict's first line)
    directed: bool = False  # `flow` is known to be client -> server (a SYN sent, a conn report)
    # A drop of an RST segment: the consequence of a reset sent, on another host often, and told after it
    # whatever the clocks say.
    of_reset: bool = False
    direction: str | None = None  # resets: "sent" | "received"
    record: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class AppView:
    """What the client's application saw: its `conn` report."""

    host: str
    outcome: str  # conn's outcome: reset, refused, timeout, abandoned, closed, open, ...
    errno: str | None
    duration_s: float | None


@dataclass(slots=True, eq=False)
class Hop:
    host: str
    event: str  # sent | nat | established | accepted | drop | reset | retransmit | bypass
    what: str
    detail: str
    time_ns: int | None  # None: before the window (an entry older than the session)
    exact: bool = True  # a kernel stamp; False: conntrack's event read off a socket (never early)
    position: int = 0  # on the flow's NAT path: how many NATs the packet had passed
    reply: bool = False  # the packet went server -> client
    count: int = 1
    of_reset: bool = False
    direction: str | None = None
    nat_number: int | None = None  # nat hops: which one on the path; bypass hops: the one skipped
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: list[str] = field(default_factory=list)

    @property
    def sends_reset(self) -> bool:
        return (self.event == "reset" and self.direction == "sent") or (
            self.event == "bypass" and bool(self.evidence.get("reset"))
        )


# -- building the hops ---------------------------------------------------------------------------------------
def group_observations(
    placed: Sequence[tuple[Observation, int, bool]],
) -> list[tuple[Hop, list[Observation]]]:
    """One hop per (host, what, text): a SYN retransmitted five times is one hop "(x5)"; the same kernel
    event reported twice (a record and a report that joined it) counts once."""
    chosen: dict[tuple[str, str, str], tuple[Hop, list[Observation]]] = {}
    seen: set[tuple[str, str, str, int]] = set()
    for observation, position, reply in placed:
        exact_key = (observation.host, observation.kind, observation.text, observation.time_ns)
        if exact_key in seen:
            continue
        seen.add(exact_key)
        key = (observation.host, observation.kind, observation.text)
        if key not in chosen:
            hop = Hop(
                host=observation.host,
                event=observation.kind,
                what=observation.what or observation.text,
                detail=observation.text,
                time_ns=observation.time_ns,
                position=position,
                reply=reply,
                count=0,
                of_reset=observation.of_reset,
                direction=observation.direction,
            )
            chosen[key] = (hop, [])
        hop, members = chosen[key]
        hop.count += 1
        members.append(observation)
        if hop.count == 1 and observation.kind == "drop":  # the group's first: its rule is theirs
            hop.fix = _firewall_fix(observation)
        if hop.time_ns is None or observation.time_ns < hop.time_ns:
            hop.time_ns = observation.time_ns
    return list(chosen.values())


def _firewall_fix(observation: Observation) -> list[str]:
    netfilter = observation.record.get("netfilter")
    if not isinstance(netfilter, Mapping):
        return []
    netns = _netns_of([observation])
    command = removal_command(netfilter, None if netns == "host" else netns)
    return [command + "   # if this traffic should pass"] if command else []


def _short_translation(nat: NatHop) -> str:
    """`REDIRECT → :15006`, `DNAT → 198.18.2.7:9000`: what the packet should have become."""
    if nat.entry.redirect:
        return f"REDIRECT → :{nat.after.dst[1]}"
    if nat.entry.dnat:
        return f"DNAT → {endpoint_text(*nat.after.dst)}"
    return f"SNAT → {endpoint_text(*nat.after.src)}"


def _segment_flags(observations: Sequence[Observation]) -> str | None:
    for observation in observations:
        trigger = observation.record.get("trigger")
        if isinstance(trigger, Mapping) and trigger.get("flags"):
            return str(trigger["flags"])
        if observation.record.get("tcp_flags"):
            return str(observation.record["tcp_flags"])
    return None


def _netns_of(observations: Sequence[Observation]) -> str | None:
    for observation in observations:
        name = observation.record.get("netns_name") or observation.record.get("netns")
        if isinstance(name, str) and name:
            return name
    return None


@dataclass(frozen=True)
class _Invalid:
    """Why a packet was not translated, from conntrack's INVALID counter on its host."""

    counted: int | None  # INVALID packets in the namespace during the window; None: not read
    be_liberal: int | None


def _invalid_for(
    host: str,
    netns: str | None,
    stats: Mapping[tuple[str, str], Mapping[str, Any]],
    records: Sequence[Observation],
) -> _Invalid:
    found = stats.get((host, netns or "")) or next(
        (value for (owner, _), value in stats.items() if owner == host), None
    )
    if found is not None:
        return _Invalid(_int(found.get("invalid")), _int(found.get("be_liberal")))
    for observation in records:  # a reset record carries its namespace's counter too (resets' enricher)
        view = observation.record.get("conntrack")
        if isinstance(view, Mapping) and view.get("loaded"):
            return _Invalid(_int(view.get("invalid_delta")), _int(view.get("be_liberal")))
    return _Invalid(None, None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _why_untranslated(
    invalid: _Invalid, flags: str | None, entry: ConntrackEntry, states: Sequence[str]
) -> str:
    if invalid.counted:
        established = entry.state == "ESTABLISHED" or "ESTABLISHED" in states
        if flags in _WINDOW_ONLY_FLAGS and established:
            return "conntrack INVALID: out of window"
        return "conntrack INVALID"
    if invalid.counted == 0:
        return "not tracked: conntrack's INVALID counter did not rise (a NOTRACK rule?)"
    return "conntrack INVALID or untracked"


def _then(observations: Sequence[Observation]) -> tuple[str, dict[str, Any]]:
    """What became of the untranslated packet on the host: the socket it reached and the reset it drew, or
    the drop that ended it."""
    evidence: dict[str, Any] = {}
    reset = next((o for o in observations if o.kind == "reset" and o.direction == "sent"), None)
    drop = next((o for o in observations if o.kind == "drop"), None)
    if drop is not None:
        evidence["drop"] = {
            key: drop.record.get(key) for key in ("reason", "location", "netfilter") if drop.record.get(key)
        }
    if reset is not None:
        record = reset.record
        port = record.get("sport")
        evidence["reset"] = {
            key: record.get(key)
            for key in ("state", "reason", "cause_code", "pid", "comm", "local")
            if record.get(key)
        }
        owner = f" of {record['comm']}[{record['pid']}]" if record.get("comm") and record.get("pid") else ""
        state = record.get("state")
        where = f" on :{port}" if port else ""
        socket_text = f"the {state} socket{owner}{where}" if state else f"no socket{where}"
        return f"reached {socket_text} → RST", evidence
    if drop is not None:
        netfilter = drop.record.get("netfilter")
        if isinstance(netfilter, Mapping) and netfilter.get("rule"):
            return f'dropped by "{netfilter["rule"]}"', evidence
        return f"dropped: {drop.record.get('reason')} at {drop.record.get('location')}", evidence
    return "reached the host's stack", evidence


def _bypass_fixes(netns: str | None, packet: FlowTuple, invalid: _Invalid) -> list[str]:
    """The fixes people use for an INVALID packet that skips a NAT, each with what it costs, pasteable."""
    place = None if netns in (None, "host") else netns
    fixes = []
    if invalid.be_liberal != 1:
        fixes.append(
            in_netns("sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1", place)
            + "   # conntrack stops judging TCP windows in this namespace: out-of-window segments are "
            "tracked and translated like the rest (the proxy's socket answers them with an ACK), but "
            "rules matching ctstate INVALID no longer see them"
        )
    address, port = packet.dst
    tool = "ip6tables" if ":" in address else "iptables"
    fixes.append(
        in_netns(
            f"{tool} -I INPUT -p tcp -d {address} --dport {port} -m conntrack --ctstate INVALID -j DROP",
            place,
        )
        + f"   # INVALID segments to :{port} are dropped before they reach its socket (no RST; TCP "
        "retransmits what mattered), silently - the next one too"
    )
    return fixes


def _reached_the_stack(observation: Observation) -> bool:
    """Did the packet get past the point where the host's NAT rewrites it (PREROUTING/OUTPUT's nat hooks)?
    A reset the host sent for it, a drop by its TCP (or a socket), or a drop in its INPUT hook (after
    PREROUTING) says so; a drop earlier on (raw or mangle PREROUTING, the IP layer) does not."""
    if observation.kind == "reset":
        return observation.direction == "sent"
    if observation.kind != "drop":
        return False
    record = observation.record
    netfilter = record.get("netfilter")
    if isinstance(netfilter, Mapping):
        return netfilter.get("hook") == "input"
    location = str(record.get("location") or "")
    return bool(record.get("sk_state")) or location.startswith(("tcp_", "inet_"))


def skipped_nat_hops(
    path: NatPath,
    hops: list[tuple[Hop, list[Observation]]],
    stats: Mapping[tuple[str, str], Mapping[str, Any]],
    states_of: Callable[[ConntrackEntry], Sequence[str]],
    where: Callable[[str], str],
) -> list[tuple[Hop, list[Observation]]]:
    """Packets that reached a host's own stack still carrying the tuple that host's NAT translates: the
    host has the flow's NAT entry (a DNAT, or a sidecar's REDIRECT), yet a segment with the tuple from before
    it drew a reset there, or was dropped by its TCP or INPUT - so conntrack did not translate it (INVALID,
    or untracked). Each such group of observations becomes one `bypass` hop; the rest are returned as
    they were."""
    remaining = list(hops)
    found: list[tuple[Hop, list[Observation]]] = []
    for number, nat in enumerate(path.hops):
        taken = [
            (hop, members)
            for hop, members in remaining
            if hop.host == nat.where
            and hop.position == number
            and not hop.of_reset
            and all(_reached_the_stack(o) for o in members)
        ]
        if not taken:
            continue
        remaining = [item for item in remaining if item not in taken]
        observations = [o for _, members in taken for o in members]
        flags = _segment_flags(observations)
        netns = _netns_of(observations)
        invalid = _invalid_for(nat.where, netns, stats, observations)
        why = _why_untranslated(invalid, flags, nat.entry, states_of(nat.entry))
        then, evidence = _then(observations)
        packet = f"{flags or 'a segment'} {nat.before.text()}"
        what = f"{packet} skipped {_short_translation(nat)} ({why}) → {then}"
        detail = f"{packet} skipped {_short_translation(nat)} on {where(nat.where)} ({why}) → {then}"
        evidence.update(
            {
                "nat": f"{nat.translation('->')} ({nat.entry.state or 'no state'})",
                "segment": next(
                    (
                        dict(o.record["trigger"])
                        for o in observations
                        if isinstance(o.record.get("trigger"), Mapping)
                    ),
                    {"flags": flags},
                ),
                "conntrack_invalid": invalid.counted,
                "nf_conntrack_tcp_be_liberal": invalid.be_liberal,
                "netns": netns,
            }
        )
        times = [hop.time_ns for hop, _ in taken if hop.time_ns is not None]
        bypass = Hop(
            host=nat.where,
            event="bypass",
            what=what,
            detail=detail,
            time_ns=min(times) if times else None,
            position=number,
            count=max(hop.count for hop, _ in taken),
            nat_number=number,
            evidence=evidence,
            fix=_bypass_fixes(netns, nat.before, invalid) if invalid.counted else [],
        )
        found.append((bypass, observations))
    return remaining + found


def reply_bypass_hops(
    path: NatPath, hops: list[tuple[Hop, list[Observation]]], where: Callable[[str], str]
) -> list[tuple[Hop, list[Observation]]]:
    """A reply that reached the client's host still carrying the address the NAT translated to (the
    server answered straight to the client, not back through the NAT host, so nothing undid the DNAT):
    the client has no socket for it and resets. Seen only by joining hosts: the client sees a stray
    SYN-ACK, the load balancer a half-open entry, the server a reset. What the client saw of the stray
    reply (the reset it drew, its drop) becomes one `bypass` hop; the rest is returned as it was."""
    clients = {hop.host for hop, _ in hops if hop.event == "sent"}
    taken = [
        (hop, members)
        for hop, members in hops
        if hop.reply and hop.position >= 1 and hop.host in clients and not hop.of_reset
    ]
    if not taken:
        return hops
    remaining = [item for item in hops if item not in taken]
    observations = [o for _, members in taken for o in members]
    first = min(observations, key=lambda o: o.time_ns)
    position = max(hop.position for hop, _ in taken)
    nat = path.hops[position - 1]
    stray = first.flow  # every observation carries the segment that arrived (a reset: what drew it)
    flags = _segment_flags(observations)
    packet = f"{flags + ' ' if flags else ''}{stray.text()}"
    then, evidence = _then(observations)
    because = f"nothing undid the {nat.kind}: no socket expects it"
    what = (
        f"the reply {packet} came straight back, bypassing the NAT on {where(nat.where)} ({because}) → {then}"
    )
    detail = (
        f"the reply {packet} came straight back to host {first.host}, bypassing the NAT on "
        f"{where(nat.where)} ({because}) → {then}"
    )
    evidence["nat"] = f"{nat.translation('->')} ({nat.entry.state or 'no state'})"
    bypass = Hop(
        host=first.host,
        event="bypass",
        what=what,
        detail=detail,
        time_ns=first.time_ns,
        position=position,
        reply=True,
        count=max(hop.count for hop, _ in taken),
        nat_number=position - 1,
        evidence=evidence,
        fix=[
            f"make {endpoint_text(*stray.src)} answer through {where(nat.where)} (route its replies back "
            f"there), or SNAT the flow on {where(nat.where)} so the replies come back to it"
        ],
    )
    return [*remaining, (bypass, observations)]


# -- ordering ------------------------------------------------------------------------------------------------
def _edges(hops: Sequence[Hop]) -> set[tuple[int, int]]:
    """What is known to have happened before what (causal_order.py), beyond each host's own clock."""
    edges: set[tuple[int, int]] = set()
    timed_nats = [i for i, hop in enumerate(hops) if hop.event == "nat" and hop.time_ns is not None]
    for i, hop in enumerate(hops):
        if hop.event == "sent":  # the client's first SYN: everything of this connection follows it
            edges |= {
                (i, j)
                for j, other in enumerate(hops)
                if j != i and not (other.event == "nat" and other.time_ns is None)
            }
    for i in timed_nats:
        k = hops[i].nat_number or 0
        for j, other in enumerate(hops):
            if j == i or other.event == "sent":
                continue
            if other.event == "nat":
                if (other.nat_number or 0) > k:
                    edges.add((i, j))  # the SYN passes the NATs in path order
            elif (
                other.reply
                or other.position > k
                or other.event == "established"  # the SYN-ACK came back through every NAT
                or (other.event == "bypass" and (other.nat_number or 0) >= k)  # the entry it skipped existed
            ):
                edges.add((i, j))
    actives = [i for i, hop in enumerate(hops) if hop.event == "established"]
    passives = [i for i, hop in enumerate(hops) if hop.event == "accepted"]
    # Linux makes the server's socket when the handshake's last ACK arrives (tcp_check_req ->
    # inet_csk_clone_lock), which the client sends as it becomes ESTABLISHED.
    edges |= {(a, p) for a in actives for p in passives}
    senders = [i for i, hop in enumerate(hops) if hop.sends_reset]
    for j, hop in enumerate(hops):
        if not ((hop.event == "reset" and hop.direction == "received") or hop.of_reset):
            continue
        candidates = [i for i in senders if i != j and (hops[i].host != hop.host or hop.of_reset)]
        if candidates:
            edges.add((_nearest_before(hops, candidates, hop), j))
    return edges


def _nearest_before(hops: Sequence[Hop], candidates: list[int], hop: Hop) -> int:
    """The reset this one answers: the latest sent no later than it, else the earliest."""
    when = hop.time_ns or 0
    before = [i for i in candidates if (hops[i].time_ns or 0) <= when]
    if before:
        return max(before, key=lambda i: hops[i].time_ns or 0)
    return min(candidates, key=lambda i: hops[i].time_ns or 0)


# -- the verdict ---------------------------------------------------------------------------------------------
def _outcome(hops: Sequence[Hop], app: AppView | None) -> str:
    if app is not None and app.outcome in _APP_OUTCOMES:
        return _APP_OUTCOMES[app.outcome]
    events = {hop.event for hop in hops}
    received = [hop for hop in hops if hop.event == "reset" and hop.direction == "received"]
    if received:
        return "refused" if all("SYN_SENT" in hop.detail for hop in received) else "reset"
    if "drop" in events or "bypass" in events:
        return "dropped"
    if "reset" in events:
        return "reset"
    if "established" in events or "accepted" in events:
        return "established"
    if "sent" in events or "retransmit" in events:
        return "unanswered"
    return "seen"


def _began(hops: Sequence[Hop]) -> int | None:
    """The first fault told: a packet that skipped a NAT, a drop (not of a reset: that one follows a
    reset), a reset sent by a host."""
    for number, hop in enumerate(hops):
        if hop.event == "bypass" or (hop.event == "drop" and not hop.of_reset) or hop.sends_reset:
            return number
    return None


def _saw(outcome: str, app: AppView | None) -> str:
    if app is None:
        return {"dropped": "its packets were dropped", "reset": "it was reset"}.get(outcome, outcome)
    where = f"on host {app.host}"
    errno = f" ({app.errno})" if app.errno else ""
    after = f" after {app.duration_s:.3g} s" if app.duration_s is not None else ""
    return {
        "reset": f"the application {where} had its connection reset{errno}",
        "refused": f"connect() {where} was refused{errno}",
        "timeout": (
            f"the application {where} gave up connecting{after}"
            if app.outcome == "abandoned"
            else f"connect() {where} timed out{errno}"
        ),
    }.get(outcome, f"the connection {where} is {outcome}")


def flow_verdict(
    name: str,
    hops: list[Hop],
    app: AppView | None,
    uncertainty_ns: Mapping[str, int],
    missing: Sequence[tuple[str, Mapping[str, Any]]],
) -> dict[str, Any]:
    """The verdict of one flow from its hops (in any order): ordered, its outcome, where it began."""
    order = causal_order(hops, _edges(hops), uncertainty_ns)
    told = [hops[entry.index] for entry in order]
    # The client's retransmits are evidence, not a hop of the path: kept only when nothing further along
    # the path explains the flow.
    if any(hop.event in ("drop", "reset", "established", "accepted", "bypass") for hop in told):
        order = [entry for entry in order if hops[entry.index].event != "retransmit"]
        told = [hops[entry.index] for entry in order]
    outcome = _outcome(told, app)
    began = _began(told)
    hop_json = []
    path_parts = []
    for number, (entry, hop) in enumerate(zip(order, told, strict=True)):
        detail = hop.detail + (f" (x{hop.count})" if hop.count > 1 else "")
        relation = "first" if number == 0 else entry.relation
        item: dict[str, Any] = {
            "host": hop.host,
            "event": hop.event,
            "detail": detail,
            "time": iso_from_ns(hop.time_ns) if hop.time_ns is not None else None,
            "order": relation,
        }
        if relation == "concurrent":
            item["uncertainty_ms"] = round(entry.uncertainty_ns / 1e6, 3)
        if hop.evidence:
            item["evidence"] = hop.evidence
        if number == began:
            item["began"] = True
        hop_json.append(item)
        joiner = "" if number == 0 else (" ~ " if relation == "concurrent" else " -> ")
        path_parts.append(joiner + detail)
    suffix = ""
    if missing:
        suffix = (
            " (partial: "
            + "; ".join(
                f"host {host} {state.get('state')}" + (f": {state['reason']}" if state.get("reason") else "")
                for host, state in missing
            )
            + ")"
        )
    cause = told[began].what if began is not None else None
    if began is not None:
        hop = told[began]
        where = f"at hop {began + 1} on host {hop.host}"
        text = f"{name}: {_saw(outcome, app)}; it began {where}: {cause}"
    else:
        text = f"{name}: {_saw(outcome, app)}; no host saw where it began"
    fix = [line for hop in told for line in hop.fix]
    clocks = {hop.host: round(uncertainty_ns.get(hop.host, 0) / 1e6, 3) for hop in told}
    return {
        "type": "verdict",
        "flow": name,
        "outcome": outcome,
        "text": text + suffix,
        "cause": cause,
        "began": began,
        "path": "".join(path_parts) + suffix,
        "hops": hop_json,
        "fix": list(dict.fromkeys(fix)),
        "clocks_ms": clocks,  # how far each host's corrected times may be off (half its offset's round trip)
        "missing_hosts": [host for host, _ in missing],
    }
