"""Name the iptables/nftables rule that dropped a packet.

The kernel tells us a packet was dropped by netfilter at some hook; it does not say by which rule. So the
matcher replays the packet through the rules registered on that hook, in priority order, the way netfilter
walks them: base chain by base chain, rule by rule, following jumps, gotos and returns. Matches the packet
tuple cannot decide (conntrack state, marks, owner, set lookups, limits...) are "maybe"; between several
candidate rules the counters decide: a DROP/REJECT rule whose packet counter grew since the trace started
most likely dropped it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from netsleuth.errors import EnvironmentProblem, NetsleuthError
from netsleuth.firewall.hooks import HOOKS, PacketAtHook, Truth, VerdictKind, all_of
from netsleuth.firewall.iptables import (
    BACKEND_NFT,
    IptablesChain,
    IptablesRule,
    IptablesRuleset,
    IptablesTable,
    chain_priority,
    hook_chain_name,
    read_iptables,
)
from netsleuth.firewall.nftables import (
    NftChain,
    NftRule,
    NftRuleset,
    NftTable,
    list_chain_text,
    looks_like_iptables_nft,
    policy_line,
    read_nftables,
    render_rule,
    rule_line,
    rule_outcomes,
)
from netsleuth.kernel.netns_exec import CommandFailed
from netsleuth.packet import PacketTuple

__all__ = ["Confidence", "FirewallMatcher", "FirewallSnapshot", "FirewallVerdict", "read_snapshot"]

Confidence = Literal["matched", "counters", "possible"]

_BACKEND_NFTABLES = "nftables"
# Deeper than any sane ruleset; stops jump loops, which the kernel refuses anyway (-ELOOP).
_MAX_JUMP_DEPTH = 64
_MAX_DECIDED = 65536
_IP_HOOKS = frozenset({"prerouting", "input", "forward", "output", "postrouting"})


@dataclass(frozen=True)
class FirewallVerdict:
    """The rule (or chain policy) that most likely dropped the packet.

    `rule` is the text the user would recognise: for iptables the `-A CHAIN ...` line as iptables-save
    prints it without its `[pkts:bytes]` prefix (or `-P CHAIN DROP`), for nftables the rule as
    `nft -a -s list` prints it (counter values left out likewise), ending in `# handle N`.

    `confidence` says how it was chosen: "matched" (every match of the rule holds for the packet),
    "counters" (some matches undecidable, but the rule's counter grew since the trace started),
    "possible" (some matches undecidable and no counter evidence).
    """

    backend: str  # "iptables-nft" | "iptables-legacy" | "nftables"
    family: str  # "ip", "ip6", "inet", "bridge", "netdev"
    hook: str
    table: str
    chain: str
    rule: str
    rule_number: int | None  # iptables: 1-based position in the chain
    handle: int | None  # nftables: the rule handle
    is_policy: bool
    confidence: Confidence

    def to_json(self) -> dict[str, object]:
        return {
            "hook": self.hook,
            "table": self.table,
            "chain": self.chain,
            "rule": self.rule,
            "backend": self.backend,
            "family": self.family,
            "rule_number": self.rule_number,
            "handle": self.handle,
            "confidence": self.confidence,
        }


@dataclass(frozen=True)
class FirewallSnapshot:
    """A namespace's rules at one moment. `nft_tables` holds only native nftables tables: those made by
    iptables-nft are in `iptables`, where their rules read as the user wrote them."""

    iptables: tuple[IptablesRuleset, ...]
    nft_tables: tuple[NftTable, ...]
    nft_available: bool
    taken_at: float
    problems: tuple[str, ...] = ()

    @classmethod
    def build(
        cls,
        iptables: Sequence[IptablesRuleset],
        nft: NftRuleset | None,
        taken_at: float,
        problems: Sequence[str] = (),
    ) -> FirewallSnapshot:
        """From parsed reader output (the real tools' or recorded fixtures')."""
        native = _native_tables(nft, iptables) if nft is not None else ()
        return cls(tuple(iptables), native, nft is not None, taken_at, tuple(problems))


def _native_tables(nft: NftRuleset, iptables: Sequence[IptablesRuleset]) -> tuple[NftTable, ...]:
    """Drop the tables iptables-nft owns, so a rule is never reported twice. The exact answer is what
    iptables-nft-save listed; when it could not be asked for a family, fall back to nft's own hint."""
    listed_families = {ruleset.nft_family for ruleset in iptables if ruleset.backend == BACKEND_NFT}
    owned = {
        (ruleset.nft_family, name)
        for ruleset in iptables
        if ruleset.backend == BACKEND_NFT
        for name in ruleset.tables
    }
    native = []
    for table in nft.tables:
        if table.dormant is True or (table.family, table.name) in owned:
            continue
        if table.family not in listed_families and looks_like_iptables_nft(table):
            continue
        native.append(table)
    return tuple(native)


def read_snapshot(netns_path: str | None, clock: Callable[[], float] = time.monotonic) -> FirewallSnapshot:
    """Read every firewall front-end of the namespace. A front-end whose tool fails is skipped and noted
    in `problems`; EnvironmentProblem only when none can be read at all."""
    taken_at = clock()  # before reading: counters then include every drop up to this moment
    problems: list[str] = []
    iptables: list[IptablesRuleset] = []
    nft: NftRuleset | None = None
    try:
        iptables = read_iptables(netns_path)
    except CommandFailed as error:
        problems.append(str(error))
    nft_installed = True
    try:
        nft = read_nftables(netns_path)
        nft_installed = nft is not None
    except CommandFailed as error:
        problems.append(str(error))
    if not iptables and nft is None:
        if problems:
            raise EnvironmentProblem(f"cannot read the firewall rules: {problems[0]}")
        if not nft_installed:
            raise EnvironmentProblem("neither nft nor iptables-save is installed, so no rule can be named")
    return FirewallSnapshot.build(iptables, nft, taken_at, problems)


# --- the walk --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Candidate:
    """A rule or policy that drops; enough to report it and to look up its counter."""

    backend: str
    family: str
    table: str
    chain: str
    counter_key: tuple[object, ...]
    packets: int | None
    is_policy: bool = False
    iptables_text: str | None = None
    rule_number: int | None = None
    nft_chain: NftChain | None = None
    nft_rule: NftRule | None = None


@dataclass(frozen=True)
class _Step:
    truth: Truth
    kind: VerdictKind
    target: str | None
    candidate: _Candidate | None


@dataclass(frozen=True)
class _Found:
    candidate: _Candidate
    truth: Truth


class _ChainSource:
    """One table's chains as walkable steps."""

    def steps(self, chain: str) -> list[_Step] | None:
        raise NotImplementedError


def _iptables_rule_key(
    ruleset: IptablesRuleset, table: str, chain: IptablesChain, rule: IptablesRule
) -> tuple[object, ...]:
    # Keyed by text (and which copy of identical text), not number: inserting a rule renumbers the rest.
    copy = sum(1 for earlier in chain.rules[: rule.number - 1] if earlier.text == rule.text)
    return ("iptables", ruleset.backend, ruleset.family, table, chain.name, rule.text, copy)


def _iptables_policy_key(ruleset: IptablesRuleset, table: str, chain: str) -> tuple[object, ...]:
    return ("iptables-policy", ruleset.backend, ruleset.family, table, chain)


def _nft_rule_key(rule: NftRule) -> tuple[object, ...]:
    return ("nft", rule.family, rule.table, rule.chain, rule.handle)


@dataclass(frozen=True)
class _IptablesSource(_ChainSource):
    ruleset: IptablesRuleset
    table: IptablesTable
    seen: PacketAtHook

    def candidate(self, chain: IptablesChain, rule: IptablesRule | None) -> _Candidate:
        ruleset, table = self.ruleset, self.table.name
        if rule is None:
            return _Candidate(
                ruleset.backend,
                ruleset.nft_family,
                table,
                chain.name,
                _iptables_policy_key(ruleset, table, chain.name),
                chain.packets,
                is_policy=True,
                iptables_text=f"-P {chain.name} {chain.policy}",
            )
        return _Candidate(
            ruleset.backend,
            ruleset.nft_family,
            table,
            chain.name,
            _iptables_rule_key(ruleset, table, chain, rule),
            rule.packets,
            iptables_text=rule.text,
            rule_number=rule.number,
        )

    def steps(self, chain: str) -> list[_Step] | None:
        found = self.table.chains.get(chain)
        if found is None:
            return None
        return [
            _Step(
                rule.evaluate(self.seen),
                rule.kind,
                rule.target,
                self.candidate(found, rule) if rule.kind == "drop" else None,
            )
            for rule in found.rules
        ]


@dataclass(frozen=True)
class _NftSource(_ChainSource):
    table: NftTable
    seen: PacketAtHook

    def candidate(self, chain: NftChain, rule: NftRule | None) -> _Candidate:
        if rule is None:
            return _Candidate(
                _BACKEND_NFTABLES,
                chain.family,
                chain.table,
                chain.name,
                ("nft-policy", chain.family, chain.table, chain.name),
                None,  # nftables keeps no counter for a chain policy
                is_policy=True,
                nft_chain=chain,
            )
        return _Candidate(
            _BACKEND_NFTABLES,
            rule.family,
            rule.table,
            rule.chain,
            _nft_rule_key(rule),
            rule.packets,
            nft_chain=chain,
            nft_rule=rule,
        )

    def steps(self, chain: str) -> list[_Step] | None:
        found = self.table.chains.get(chain)
        if found is None:
            return None
        steps = []
        for rule in found.rules:
            for outcome in rule_outcomes(rule, self.table, self.seen):
                candidate = self.candidate(found, rule) if outcome.kind == "drop" else None
                steps.append(_Step(outcome.truth, outcome.kind, outcome.target, candidate))
        return steps


@dataclass(frozen=True)
class _BaseChain:
    priority: int
    source: _ChainSource
    name: str
    path: Truth  # None when the chain may not see the packet at all (NAT chains, unknown device)
    policy_drops: bool
    policy_candidate: _Candidate | None


def _iptables_bases(snapshot: FirewallSnapshot, seen: PacketAtHook) -> list[_BaseChain]:
    chain_name = hook_chain_name(seen.hook)
    if chain_name is None:
        return []
    bases = []
    for ruleset in snapshot.iptables:
        if ruleset.family != seen.packet.family:
            continue
        for table in ruleset.tables.values():
            chain = table.chains.get(chain_name)
            if chain is None or chain.policy is None:
                continue
            source = _IptablesSource(ruleset, table, seen)
            drops = chain.policy.upper() == "DROP"
            bases.append(
                _BaseChain(
                    chain_priority(table.name, chain_name),
                    source,
                    chain_name,
                    # NAT chains only see the first packet of a connection (net/netfilter/nf_nat_core.c).
                    None if table.name == "nat" else True,
                    drops,
                    source.candidate(chain, None) if drops else None,
                )
            )
    return bases


def _nft_hook_matches(table: NftTable, chain: NftChain, seen: PacketAtHook) -> Truth:
    """Whether this base chain runs for the packet's hook and family (None: only perhaps, e.g. an ingress
    chain bound to a device we do not know the packet came in on)."""
    hook = seen.hook
    if hook in _IP_HOOKS:
        families = (
            ("ip", "inet") if seen.packet.family == 4 else ("ip6", "inet") if seen.packet.family == 6 else ()
        )
        return table.family in families and chain.hook == hook
    if hook.startswith("bridge-"):
        return table.family == "bridge" and chain.hook == hook.removeprefix("bridge-")
    if hook in ("ingress", "egress"):
        if chain.hook != hook or table.family not in ("netdev", "inet"):
            return False
        device = seen.in_ifname if hook == "ingress" else seen.out_ifname
        if not chain.devices or device is None:
            return None
        return device in chain.devices
    return False


def _nft_bases(snapshot: FirewallSnapshot, seen: PacketAtHook) -> list[_BaseChain]:
    bases = []
    for table in snapshot.nft_tables:
        source = _NftSource(table, seen)
        for chain in table.chains.values():
            if chain.hook is None:
                continue
            runs = _nft_hook_matches(table, chain, seen)
            if runs is False:
                continue
            drops = (chain.policy or "accept") == "drop"
            path = all_of((runs, None if chain.type == "nat" else True))
            bases.append(
                _BaseChain(
                    chain.priority or 0,
                    source,
                    chain.name,
                    path,
                    drops,
                    source.candidate(chain, None) if drops else None,
                )
            )
    return bases


@dataclass
class _Walk:
    """Collects, in the order netfilter would reach them, every rule that may have dropped the packet."""

    found: list[_Found] = field(default_factory=list)

    def chain(self, source: _ChainSource, name: str, path: Truth, depth: int) -> str:
        """Walk one chain; returns "drop"/"accept" when the packet certainly ends here, "return" when it
        certainly leaves the chain, "end" otherwise. Within a maybe-path nothing is certain, so the walk
        goes on and keeps collecting candidates."""
        steps = source.steps(name)
        if steps is None or depth > _MAX_JUMP_DEPTH:
            return "end"
        for step in steps:
            truth = all_of((path, step.truth))
            if truth is False:
                continue
            if step.kind == "drop" and step.candidate is not None:
                self.found.append(_Found(step.candidate, truth))
                if truth:
                    return "drop"
            elif step.kind in ("accept", "return") and truth:
                return step.kind
            elif step.kind in ("jump", "goto") and step.target is not None:
                end = self.chain(source, step.target, truth, depth + 1)
                if end in ("drop", "accept"):
                    return end
                if step.kind == "goto" and truth:
                    return "return"  # the goto'd chain ended: back to whoever called this chain
        return "end"

    def hook(self, bases: Sequence[_BaseChain]) -> None:
        for base in sorted(bases, key=lambda base: base.priority):
            end = self.chain(base.source, base.name, base.path, 0)
            if end == "drop":
                return
            if end == "accept" or not base.policy_drops or base.policy_candidate is None:
                continue
            self.found.append(_Found(base.policy_candidate, base.path))
            if base.path is True:
                return


# --- the matcher -----------------------------------------------------------------------------------------


def _counters(snapshot: FirewallSnapshot) -> tuple[dict[tuple[object, ...], int], set[tuple[object, ...]]]:
    """Every rule's packet counter by key, and which front-ends the snapshot covers."""
    counters: dict[tuple[object, ...], int] = {}
    sources: set[tuple[object, ...]] = set()
    for ruleset in snapshot.iptables:
        sources.add(("iptables", ruleset.backend, ruleset.family))
        for table in ruleset.tables.values():
            for chain in table.chains.values():
                if chain.packets is not None:
                    counters[_iptables_policy_key(ruleset, table.name, chain.name)] = chain.packets
                for rule in chain.rules:
                    if rule.packets is not None:
                        counters[_iptables_rule_key(ruleset, table.name, chain, rule)] = rule.packets
    if snapshot.nft_available:
        sources.add(("nft",))
    for nft_table in snapshot.nft_tables:
        for nft_chain in nft_table.chains.values():
            for nft_rule in nft_chain.rules:
                if nft_rule.packets is not None:
                    counters[_nft_rule_key(nft_rule)] = nft_rule.packets
    return counters, sources


def _ruleset_version(netns_path: str | None) -> Callable[[], Hashable | None] | None:
    """The namespace's RulesetVersion, or None when it cannot be watched (then every reading is fresh)."""
    from netsleuth.firewall.ruleset_version import RulesetVersion

    try:
        return RulesetVersion(netns_path)
    except (NetsleuthError, OSError):
        return None


def _source_of(candidate: _Candidate) -> tuple[object, ...]:
    if candidate.backend == _BACKEND_NFTABLES:
        return ("nft",)
    return ("iptables", candidate.backend, 4 if candidate.family == "ip" else 6)


class FirewallMatcher:
    """Explains netfilter drops in one network namespace. Create it when the trace starts: that snapshot
    of the counters is what later counter growth is measured against.

    Rules are re-read at most every `max_age` seconds (a burst of drops shares one reading), and once more,
    at most every `min_refresh` seconds, when a drop cannot be pinned down by its matches alone and the
    reading may predate it. A reading stands past those ages while the rules' version (`version`: by
    default netsleuth.firewall.ruleset_version for the real tools, none for a test's `reader`) says no rule
    changed and no answer on it looked at counters: a storm of drops one rule decides runs no tool.
    `reader` and `chain_listing` exist for tests (recorded fixtures instead of the real tools). The
    constructor raises EnvironmentProblem when no firewall tool can be read and UsageError for a namespace
    that does not exist; `explain` never raises: when a later reading fails it answers from the last good
    one and notes why in `problems`.
    """

    def __init__(
        self,
        netns_path: str | None,
        *,
        reader: Callable[[str | None], FirewallSnapshot] | None = None,
        chain_listing: Callable[[NftChain], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_age: float = 0.5,
        min_refresh: float = 0.1,
        version: Callable[[], Hashable | None] | None = None,
    ) -> None:
        self.netns_path = netns_path
        self._read = reader or (lambda path: read_snapshot(path, clock))
        self._chain_listing = chain_listing or (lambda chain: list_chain_text(netns_path, chain))
        self._clock = clock
        self._max_age = max_age
        self._min_refresh = min_refresh
        self._lock = threading.Lock()
        self._version, self._closes_version = version, False
        if version is None and reader is None:
            self._version, self._closes_version = _ruleset_version(netns_path), True
        version_at_start = self._version() if self._version is not None else None
        self._start = self._read(netns_path)
        self._baseline, self._baseline_sources = _counters(self._start)
        self._snapshot: FirewallSnapshot | None = None
        self._listings: dict[tuple[str, str, str], str | None] = {}
        # Verdicts decided on one reading of the rules, by the packet as the hook saw it: a storm of drops
        # of one kind walks the ruleset once per reading, not once per packet. The key is everything
        # `_decide` reads of a packet (PacketAtHook: the tuple with addresses, ports, protocol, flags,
        # ICMP type and length, the hook and both devices); the value depends otherwise only on the reading
        # (rules and counters) and the baseline, so the memo is dropped whenever the reading changes and an
        # answer is the same as deciding again.
        self._decided: dict[PacketAtHook, FirewallVerdict | None] = {}
        self._decided_on: FirewallSnapshot | None = None
        self._checked_at = 0.0  # when the current reading was last known to hold every rule
        self._read_version: Hashable | None = None  # the rules' version just before that reading
        self._counters_asked = False  # an answer on the current reading depended on counters
        if version_at_start is not None:
            # The start reading answers the first drops too while the rules' version stands, as any reading
            # does: a storm's first drops no longer wait for the tools to run again (a fork and several tools,
            # ~40 ms, while the storm fills the ring). Its counters are the baseline, so an answer that weighs
            # counters reads the rules again at once (_current).
            self._snapshot, self._read_version = self._start, version_at_start
            self._checked_at = self._start.taken_at

    @property
    def problems(self) -> tuple[str, ...]:
        """What could not be read at the last reading (a front-end, or everything): a note for the user."""
        return (self._snapshot or self._start).problems

    def explain(
        self, packet: PacketTuple, hook: str, in_ifname: str | None, out_ifname: str | None
    ) -> FirewallVerdict | None:
        """The rule that most likely dropped `packet` at `hook` (see `hook_from_stack`), or None when no
        rule or policy on that hook can have dropped it."""
        if hook not in HOOKS:
            return None
        # A hook without an input (output) or output (prerouting, input, ingress) device compares "".
        if in_ifname is None and hook in ("output", "bridge-output"):
            in_ifname = ""
        if out_ifname is None and hook in (
            "prerouting",
            "input",
            "ingress",
            "bridge-prerouting",
            "bridge-input",
        ):
            out_ifname = ""
        seen = PacketAtHook(packet, hook, in_ifname, out_ifname)
        with self._lock:
            snapshot = self._current(self._max_age)
            verdict = self._decide_once(snapshot, seen)
            if verdict is None or verdict.confidence != "matched":
                fresher = self._current(self._min_refresh)
                if fresher is not snapshot:
                    verdict = self._decide_once(fresher, seen)
            return verdict

    def _decide_once(self, snapshot: FirewallSnapshot, seen: PacketAtHook) -> FirewallVerdict | None:
        if snapshot is not self._decided_on:
            self._decided = {}
            self._decided_on = snapshot
        if seen in self._decided:
            return self._decided[seen]
        if len(self._decided) >= _MAX_DECIDED:
            self._decided.clear()  # a scan of many addresses within one reading: start over
        verdict = self._decided[seen] = self._decide(snapshot, seen)
        return verdict

    def _current(self, max_age: float) -> FirewallSnapshot:
        now = self._clock()
        # The start reading's counters are the baseline: it cannot tell what grew since.
        counters_unknown = self._counters_asked and self._snapshot is self._start
        if self._snapshot is not None and now - self._checked_at <= max_age and not counters_unknown:
            return self._snapshot
        version = self._version() if self._version is not None else None
        if (
            self._snapshot is not None
            and version is not None
            and version == self._read_version
            and not self._counters_asked
        ):
            # No rule changed since this reading and none of its answers looked at counters (the only thing
            # that moved since): a new reading would answer the same.
            self._checked_at = now
            return self._snapshot
        try:
            self._snapshot = self._read(self.netns_path)
            self._read_version = version
        except NetsleuthError as error:
            # The namespace went away or a tool broke mid-trace: answer from the last reading, noted,
            # and wait out max_age before trying again.
            last = self._snapshot or self._start
            problems = (*last.problems, str(error))
            self._snapshot = dataclasses.replace(last, taken_at=self._clock(), problems=problems)
            self._read_version = None
        self._checked_at = self._snapshot.taken_at
        self._counters_asked = False
        self._listings.clear()
        return self._snapshot

    def close(self) -> None:
        """Release the version watch (a netlink socket and two fds in the namespace)."""
        close = getattr(self._version, "close", None)
        if self._closes_version and close is not None:
            close()

    def _grew(self, candidate: _Candidate) -> bool | None:
        """Whether the candidate's counter grew since the start; None when it has none, when the start
        could not read its front-end, or when the counters were reset (zeroed or the rule replaced)."""
        if candidate.packets is None or _source_of(candidate) not in self._baseline_sources:
            return None
        delta = candidate.packets - self._baseline.get(candidate.counter_key, 0)
        return None if delta < 0 else delta > 0

    def _decide(self, snapshot: FirewallSnapshot, seen: PacketAtHook) -> FirewallVerdict | None:
        walk = _Walk()
        walk.hook(_iptables_bases(snapshot, seen) + _nft_bases(snapshot, seen))
        if not walk.found:
            return None
        # One rule that certainly drops the packet is the answer whatever the counters say; any other answer
        # weighs counters, so the next reading must be a fresh one.
        if len(walk.found) > 1 or walk.found[0].truth is not True:
            self._counters_asked = True
        grew = {id(found): self._grew(found.candidate) for found in walk.found}
        # The walk stops at the first certain drop, so at most the last candidate is certain.
        certain = [found for found in walk.found if found.truth is True]
        if certain and grew[id(certain[0])] is not False:
            return self._verdict(certain[0].candidate, seen.hook, "matched")
        grown = [found for found in walk.found if grew[id(found)] is True]
        if grown:
            return self._verdict(grown[0].candidate, seen.hook, "counters")
        if certain:  # its counter did not move: the reading may predate the drop; still the best answer
            return self._verdict(certain[0].candidate, seen.hook, "matched")
        unknown = [found for found in walk.found if grew[id(found)] is None]
        return self._verdict((unknown or walk.found)[0].candidate, seen.hook, "possible")

    def _listing(self, chain: NftChain) -> str | None:
        key = (chain.family, chain.table, chain.name)
        if key not in self._listings:
            try:
                self._listings[key] = self._chain_listing(chain)
            except NetsleuthError:
                self._listings[key] = None
        return self._listings[key]

    def _nft_text(self, candidate: _Candidate) -> str:
        chain, rule = candidate.nft_chain, candidate.nft_rule
        assert chain is not None
        listing = self._listing(chain)
        if rule is not None:
            return (rule_line(listing, rule.handle) if listing else None) or render_rule(rule)
        fallback = f"type {chain.type} hook {chain.hook} priority {chain.priority}; policy {chain.policy};"
        return (policy_line(listing) if listing else None) or fallback

    def _verdict(self, candidate: _Candidate, hook: str, confidence: Confidence) -> FirewallVerdict:
        text = candidate.iptables_text if candidate.iptables_text is not None else self._nft_text(candidate)
        return FirewallVerdict(
            backend=candidate.backend,
            family=candidate.family,
            hook=hook,
            table=candidate.table,
            chain=candidate.chain,
            rule=text,
            rule_number=candidate.rule_number,
            handle=candidate.nft_rule.handle if candidate.nft_rule is not None else None,
            is_policy=candidate.is_policy,
            confidence=confidence,
        )
