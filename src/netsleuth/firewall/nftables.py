"""nftables rules from `nft -j -a list ruleset`, and how a rule judges a packet.

The JSON is libnftables' documented machine interface (libnftables-json(5)); everything structural (tables,
chains with hook/priority/policy, rules with handles, counters and expressions) comes from it. Only the
text shown to the user is taken from `nft -a -s list chain`, because that is exactly how nft prints the rule
(-s leaves out counter values, as the iptables text leaves out its [pkts:bytes] prefix).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
import shutil
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from netsleuth.errors import EnvironmentProblem
from netsleuth.firewall.hooks import PacketAtHook, Truth, VerdictKind, all_of
from netsleuth.kernel.netns_exec import run_in_netns
from netsleuth.packet import proto_number

__all__ = [
    "NftChain",
    "NftOutcome",
    "NftRule",
    "NftRuleset",
    "NftSet",
    "NftTable",
    "list_chain_text",
    "looks_like_iptables_nft",
    "parse_nft_json",
    "policy_line",
    "read_nftables",
    "render_rule",
    "rule_line",
    "rule_outcomes",
]

_Json = Mapping[str, object]

# nft(8) "PRIORITY": the standard names, per family. Recent nft prints numbers in JSON; older ones may not.
_PRIORITY_NAMES = {"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}
_BRIDGE_PRIORITY_NAMES = {"dstnat": -300, "filter": -200, "out": 100, "srcnat": 300}
_IPTABLES_TABLES = frozenset({"filter", "nat", "mangle", "raw", "security"})
_TABLE_FLAGS = frozenset({"dormant", "owner", "persist"})

_VERDICT_KINDS: Mapping[str, VerdictKind] = {
    "accept": "accept",
    "drop": "drop",
    "reject": "drop",
    "continue": "continue",
    "return": "return",
    "jump": "jump",
    "goto": "goto",
    # NAT statements end the chain with NF_ACCEPT (net/netfilter/nft_nat.c); queue and fwd hand the
    # packet elsewhere, so this chain no longer decides its fate.
    "snat": "accept",
    "dnat": "accept",
    "masquerade": "accept",
    "redirect": "accept",
    "queue": "accept",
    "fwd": "accept",
    "synproxy": "accept",
}
# fmt: off
# Statements that act but never stop the rule.
_PLAIN_STATEMENTS = frozenset({
    "counter", "log", "mangle", "notrack", "set", "map", "ct helper", "ct timeout", "ct expectation", "dup",
    "secmark", "flow", "last",
})
_XT_DROP_TARGETS = frozenset({"DROP", "REJECT"})
_XT_ACCEPT_TARGETS = frozenset({"ACCEPT", "DNAT", "SNAT", "MASQUERADE", "REDIRECT", "NETMAP", "NFQUEUE"})

# include/uapi/linux/netfilter/nf_tables.h / RFC 9293: tcp flags as nft names them.
_TCP_FLAGS = {"fin": 0x01, "syn": 0x02, "rst": 0x04, "psh": 0x08, "ack": 0x10, "urg": 0x20, "ecn": 0x40,
              "cwr": 0x80}
# nft's symbol tables (src/proto.c): the ICMP types it prints by name.
_ICMP_TYPES = {
    "echo-reply": 0, "destination-unreachable": 3, "source-quench": 4, "redirect": 5, "echo-request": 8,
    "router-advertisement": 9, "router-solicitation": 10, "time-exceeded": 11, "parameter-problem": 12,
    "timestamp-request": 13, "timestamp-reply": 14, "info-request": 15, "info-reply": 16,
    "address-mask-request": 17, "address-mask-reply": 18,
}
_ICMPV6_TYPES = {
    "destination-unreachable": 1, "packet-too-big": 2, "time-exceeded": 3, "parameter-problem": 4,
    "echo-request": 128, "echo-reply": 129, "mld-listener-query": 130, "mld-listener-report": 131,
    "mld-listener-done": 132, "mld-listener-reduction": 132, "nd-router-solicit": 133,
    "nd-router-advert": 134, "nd-neighbor-solicit": 135, "nd-neighbor-advert": 136, "nd-redirect": 137,
    "router-renumbering": 138, "ind-neighbor-solicit": 141, "ind-neighbor-advert": 142,
    "mld2-listener-report": 143,
}
# fmt: on
_PROTOCOL_ALIASES = {"ipv6-icmp": 58, "icmpv6": 58}
_L4_PAYLOADS = {"tcp": 6, "udp": 17, "udplite": 136, "sctp": 132, "dccp": 33}
_NFPROTO = {"ipv4": 4, "ipv6": 6}
_ETHERTYPES: Mapping[str | int, int] = {"ip": 4, "ip6": 6, 0x0800: 4, 0x86DD: 6}
# Meta keys nft prints without the `meta` keyword.
_BARE_META_KEYS = frozenset(
    {"iif", "iifname", "oif", "oifname", "iiftype", "oiftype", "iifgroup", "oifgroup", "ibrname", "obrname"}
)
_IFNAME_KEYS = frozenset({"iif", "iifname", "oif", "oifname", "ibrname", "obrname"})
_HANDLE_SUFFIX = re.compile(r"# handle (\d+)$")


@dataclass(frozen=True)
class NftRule:
    family: str
    table: str
    chain: str
    handle: int
    statements: tuple[_Json, ...]
    comment: str | None
    packets: int | None  # from the last `counter` statement; None without one
    bytes: int | None


@dataclass(frozen=True)
class NftChain:
    family: str
    table: str
    name: str
    handle: int
    type: str | None  # None for a regular (non-base) chain
    hook: str | None
    priority: int | None
    policy: str | None
    devices: tuple[str, ...]  # netdev / inet ingress chains; empty when nft does not say
    rules: tuple[NftRule, ...]


@dataclass(frozen=True)
class NftSet:
    name: str
    elements: tuple[object, ...] | None  # None when unusable here (concatenated keys, no listing)
    is_map: bool


@dataclass(frozen=True)
class NftTable:
    family: str
    name: str
    handle: int
    # A dormant table's chains are unregistered from their hooks (nft(8) "TABLES"). None when nft's JSON
    # garbled the flags: nft before 1.0.9 printed a freed string for a single flag (nftables commit
    # "json: fix use after free in table_flags_json()"); `read_nftables` then asks the text listing.
    dormant: bool | None
    chains: Mapping[str, NftChain]
    sets: Mapping[str, NftSet]

    @property
    def has_xt(self) -> bool:
        """Whether any rule uses iptables' compat (xt) expressions, the mark nft itself uses to warn
        "table ... is managed by iptables-nft, do not touch!"."""
        return any(
            "xt" in statement
            for chain in self.chains.values()
            for rule in chain.rules
            for statement in rule.statements
        )


@dataclass(frozen=True)
class NftRuleset:
    tables: tuple[NftTable, ...]


@dataclass(frozen=True)
class NftOutcome:
    """What a rule may do to the packet: `truth` is whether it does (None: cannot tell)."""

    truth: Truth
    kind: VerdictKind
    target: str | None = None


# --- parsing ---------------------------------------------------------------------------------------------


def _mapping(value: object) -> _Json | None:
    return value if isinstance(value, Mapping) else None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _single(statement: _Json) -> tuple[str, object]:
    """JSON statements and expressions are one-key objects: {"counter": {...}}."""
    for key, value in statement.items():
        return key, value
    return "", None


def _priority(value: object, family: str) -> int | None:
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    names = _BRIDGE_PRIORITY_NAMES if family == "bridge" else _PRIORITY_NAMES
    found = re.fullmatch(r"\s*([a-z]+)\s*(?:([+-])\s*(\d+))?\s*", value)
    if found is None or found.group(1) not in names:
        return int(value) if value.lstrip("-").isdigit() else None
    offset = int(found.group(3) or 0) * (-1 if found.group(2) == "-" else 1)
    return names[found.group(1)] + offset


def _last_counter(statements: Sequence[_Json]) -> tuple[int | None, int | None]:
    packets = byte_count = None
    for statement in statements:
        counter = _mapping(statement.get("counter"))
        if counter is not None:
            packets, byte_count = _int_or_none(counter.get("packets")), _int_or_none(counter.get("bytes"))
    return packets, byte_count


def _set_elements(body: _Json) -> tuple[object, ...] | None:
    elements = body.get("elem", [])
    if not isinstance(elements, list) or isinstance(body.get("type"), list):
        return None  # concatenated key types: "ipv4_addr . inet_service"
    return tuple(elements)


def _strings(value: object) -> tuple[str, ...]:
    """A JSON field that is one string or a list of them (chain devices, table flags)."""
    if isinstance(value, str):
        return (value,)
    return tuple(str(item) for item in value) if isinstance(value, list) else ()


def _parse_rule(body: _Json) -> NftRule:
    expressions = body.get("expr")
    statements = (
        tuple(s for s in expressions if isinstance(s, Mapping)) if isinstance(expressions, list) else ()
    )
    packets, byte_count = _last_counter(statements)
    comment = body.get("comment")
    return NftRule(
        family=str(body.get("family")),
        table=str(body.get("table")),
        chain=str(body.get("chain")),
        handle=_int_or_none(body.get("handle")) or 0,
        statements=statements,
        comment=comment if isinstance(comment, str) else None,
        packets=packets,
        bytes=byte_count,
    )


def _parse_chain(body: _Json, rules: Sequence[NftRule]) -> NftChain:
    family = str(body.get("family"))
    return NftChain(
        family=family,
        table=str(body.get("table")),
        name=str(body.get("name")),
        handle=_int_or_none(body.get("handle")) or 0,
        type=str(body["type"]) if "type" in body else None,
        hook=str(body["hook"]) if "hook" in body else None,
        priority=_priority(body.get("prio"), family),
        policy=str(body["policy"]) if "policy" in body else None,
        devices=_strings(body.get("dev", body.get("devices"))),
        rules=tuple(rules),
    )


def _dormant(flags: Sequence[str]) -> bool | None:
    if "dormant" in flags:
        return True
    return False if all(flag in _TABLE_FLAGS for flag in flags) else None


def parse_nft_json(text: str) -> NftRuleset:
    """Parse `nft -j -a list ruleset`."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnvironmentProblem(f"nft printed JSON netsleuth cannot read ({error.msg})") from None
    items = document.get("nftables") if isinstance(document, dict) else None
    objects: dict[str, list[_Json]] = {}
    for item in items if isinstance(items, list) else []:
        kind, value = _single(item) if isinstance(item, dict) else ("", None)
        body = _mapping(value)
        if body is not None:
            objects.setdefault(kind, []).append(body)

    def key(body: _Json, name_field: str = "table") -> tuple[str, str]:
        return str(body.get("family")), str(body.get(name_field))

    rules: dict[tuple[str, str, str], list[NftRule]] = {}
    for body in objects.get("rule", []):
        rule = _parse_rule(body)
        rules.setdefault((rule.family, rule.table, rule.chain), []).append(rule)
    chains: dict[tuple[str, str], dict[str, NftChain]] = {}
    for body in objects.get("chain", []):
        chain = _parse_chain(body, rules.get((*key(body), str(body.get("name"))), ()))
        chains.setdefault(key(body), {})[chain.name] = chain
    sets: dict[tuple[str, str], dict[str, NftSet]] = {}
    for kind in ("set", "map"):
        for body in objects.get(kind, []):
            name = str(body.get("name"))
            sets.setdefault(key(body), {})[name] = NftSet(name, _set_elements(body), kind == "map")
    tables = []
    for body in objects.get("table", []):
        family, name = key(body, "name")
        tables.append(
            NftTable(
                family=family,
                name=name,
                handle=_int_or_none(body.get("handle")) or 0,
                dormant=_dormant(_strings(body.get("flags"))),
                chains=chains.get((family, name), {}),
                sets=sets.get((family, name), {}),
            )
        )
    return NftRuleset(tuple(tables))


def looks_like_iptables_nft(table: NftTable) -> bool:
    """Best guess, for when iptables-nft-save cannot be asked, that iptables-nft made this table: it uses
    xt compat expressions, or it has an iptables table name with only iptables-named base chains."""
    if table.has_xt:
        return True
    base_chains = [chain for chain in table.chains.values() if chain.hook is not None]
    return (
        table.family in ("ip", "ip6")
        and table.name in _IPTABLES_TABLES
        and bool(base_chains)
        and all(chain.name == (chain.hook or "").upper() for chain in base_chains)
    )


def read_nftables(netns_path: str | None) -> NftRuleset | None:
    """The namespace's nftables ruleset; None when nft is not installed."""
    if shutil.which("nft") is None:
        return None
    ruleset = parse_nft_json(run_in_netns(["nft", "-j", "-a", "list", "ruleset"], netns_path))
    if all(table.dormant is not None for table in ruleset.tables):
        return ruleset
    tables = []
    for table in ruleset.tables:
        if table.dormant is None:
            listing = run_in_netns(["nft", "list", "table", table.family, table.name], netns_path)
            dormant = any(
                line.split()[:1] == ["flags"] and "dormant" in line for line in listing.splitlines()
            )
            table = dataclasses.replace(table, dormant=dormant)
        tables.append(table)
    return NftRuleset(tuple(tables))


def list_chain_text(netns_path: str | None, chain: NftChain) -> str:
    """`nft -a -s list chain`: the chain as nft prints it, with handles and without counter values."""
    return run_in_netns(
        ["nft", "-a", "-s", "list", "chain", chain.family, chain.table, chain.name], netns_path
    )


def rule_line(listing: str, handle: int) -> str | None:
    """The line of `listing` (nft -a output) for the rule with this handle, ending in `# handle N`."""
    for line in listing.splitlines():
        found = _HANDLE_SUFFIX.search(line.rstrip())
        # Table and chain headers end in `{ # handle N` too; their handles are a different numbering.
        if found and int(found.group(1)) == handle and "{ # handle" not in line:
            return line.strip()
    return None


def policy_line(listing: str) -> str | None:
    """The `type filter hook input priority filter; policy drop;` line of a base chain listing."""
    for line in listing.splitlines():
        if line.strip().startswith("type ") and " hook " in line:
            return line.strip()
    return None


# --- evaluation ------------------------------------------------------------------------------------------

# The packet side of a match: a kind telling how to read the rule's values, and the packet's value (None
# when the packet tuple does not carry it). `_MISMATCH` marks an implicit dependency that fails: `tcp dport`
# on a UDP packet is false whatever the port (nft adds a hidden `meta l4proto tcp` for it).
_Field = tuple[str, object]
_MISMATCH: _Field = ("mismatch", None)
_UNKNOWN: _Field = ("unknown", None)


def _payload_field(protocol: str, name: str, seen: PacketAtHook) -> _Field:
    packet = seen.packet
    if protocol in ("ip", "ip6"):
        if packet.family != (4 if protocol == "ip" else 6):
            return _MISMATCH
        if name in ("saddr", "daddr"):
            text = packet.saddr if name == "saddr" else packet.daddr
            return ("addr", ipaddress.ip_address(text) if text else None)
        if name in ("protocol", "nexthdr"):
            return ("proto", packet.proto)
        return _UNKNOWN
    if protocol in _L4_PAYLOADS:
        if packet.proto != _L4_PAYLOADS[protocol]:
            return _MISMATCH
        if name in ("sport", "dport"):
            return ("int", packet.sport if name == "sport" else packet.dport)
        if protocol == "tcp" and name == "flags":
            return ("flags", packet.tcp_flags)
        return _UNKNOWN
    if protocol == "th" and name in ("sport", "dport"):
        return ("int", packet.sport if name == "sport" else packet.dport)
    if protocol in ("icmp", "icmpv6"):
        if packet.proto != (1 if protocol == "icmp" else 58):
            return _MISMATCH
        if name == "type":
            return (protocol, packet.icmp_type)
        if name == "code":
            return ("icmp-code", packet.icmp_code)
    return _UNKNOWN


def _meta_field(key: str, seen: PacketAtHook) -> _Field:
    if key == "l4proto":
        return ("proto", seen.packet.proto)
    if key == "nfproto":
        return ("nfproto", seen.packet.family or None)
    if key == "protocol":
        return ("ethertype", seen.packet.family or None)
    if key in ("iifname", "iif"):
        return ("ifname", seen.in_ifname)
    if key in ("oifname", "oif"):
        return ("ifname", seen.out_ifname)
    return _UNKNOWN


def _field(expression: object, seen: PacketAtHook) -> _Field:
    body = _mapping(expression)
    if body is None:
        return _UNKNOWN
    kind, value = _single(body)
    inner = _mapping(value)
    if kind == "payload" and inner is not None and "protocol" in inner:
        return _payload_field(str(inner["protocol"]), str(inner.get("field")), seen)
    if kind == "meta" and inner is not None:
        return _meta_field(str(inner.get("key")), seen)
    if kind == "&" and isinstance(value, list) and len(value) == 2:
        # `tcp flags & (syn | ack) == syn`, `ip saddr & 255.255.0.255 == 198.18.0.7`
        field = _field(value[0], seen)
        field_kind, actual = field
        if field_kind == "flags" and isinstance(actual, int):
            mask = _flags_value(value[1])
            return ("flags", actual & mask) if mask is not None else _UNKNOWN
        if field_kind == "addr" and isinstance(actual, ipaddress.IPv4Address | ipaddress.IPv6Address):
            return ("masked-addr", (int(actual), value[1]))
        return _MISMATCH if field == _MISMATCH else _UNKNOWN
    return _UNKNOWN  # ct, fib, socket, rt, osf, numgen, concatenations, raw payloads...


def _flags_value(value: object) -> int | None:
    if isinstance(value, int):
        return value
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if names is None or not all(isinstance(name, str) and name in _TCP_FLAGS for name in names):
        return None
    total = 0
    for name in names:
        total |= _TCP_FLAGS[name]
    return total


def _number(kind: str, value: object) -> int | None:
    """A rule-side value as a number comparable with the packet's, for the kind of field."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _ETHERTYPES.get(value) if kind == "ethertype" else value
    if not isinstance(value, str):
        return None
    if value.isdigit():
        return int(value)
    if kind == "proto":
        return _PROTOCOL_ALIASES.get(value, proto_number(value))
    if kind == "icmp":
        return _ICMP_TYPES.get(value)
    if kind == "icmpv6":
        return _ICMPV6_TYPES.get(value)
    if kind == "nfproto":
        return _NFPROTO.get(value)
    if kind == "ethertype":
        return _ETHERTYPES.get(value)
    if kind == "int":
        try:
            return socket.getservbyname(value)
        except OSError:
            return None
    return None


def _ifname_equal(actual: str, pattern: str) -> bool:
    # nft(8): a trailing `*` makes an interface name a prefix wildcard; `\*` is a literal star.
    if pattern.endswith("*") and not pattern.endswith("\\*"):
        return actual.startswith(pattern[:-1]) and bool(actual)
    return actual == pattern.replace("\\*", "*")


def _element_equal(kind: str, actual: object, element: object) -> Truth:
    """Whether the packet's value equals (or falls inside) one rule-side value, prefix or range."""
    body = _mapping(element)
    if body is not None and "elem" in body:
        wrapped = _mapping(body["elem"])
        return _element_equal(kind, actual, wrapped.get("val") if wrapped else None)
    if kind == "addr" and isinstance(actual, ipaddress.IPv4Address | ipaddress.IPv6Address):
        try:
            if isinstance(element, str):
                return actual == ipaddress.ip_address(element)
            prefix = _mapping(body.get("prefix")) if body else None
            if prefix is not None:
                return actual in ipaddress.ip_network(f"{prefix['addr']}/{prefix['len']}", strict=False)
            bounds = body.get("range") if body else None
            if isinstance(bounds, list) and len(bounds) == 2:
                first, last = (int(ipaddress.ip_address(str(bound))) for bound in bounds)
                version = ipaddress.ip_address(str(bounds[0])).version
                return version == actual.version and first <= int(actual) <= last
        except (ValueError, KeyError, TypeError):
            return None
        return None
    if kind == "masked-addr" and isinstance(actual, tuple) and isinstance(element, str):
        value, mask_text = actual
        try:
            mask = int(ipaddress.ip_address(str(mask_text)))
            return bool(value & mask == int(ipaddress.ip_address(element)))
        except ValueError:
            return None
    if kind == "ifname" and isinstance(actual, str) and isinstance(element, str):
        return _ifname_equal(actual, element)
    if kind == "flags" and isinstance(actual, int):
        flags = _flags_value(element)
        return None if flags is None else actual == flags
    if isinstance(actual, int):
        bounds = body.get("range") if body else None
        if isinstance(bounds, list) and len(bounds) == 2:
            low, high = _number(kind, bounds[0]), _number(kind, bounds[1])
            return None if low is None or high is None else low <= actual <= high
        number = _number(kind, element)
        return None if number is None else actual == number
    return None


def _any_equal(kind: str, actual: object, right: object, table: NftTable) -> Truth:
    """Membership of the packet's value in the rule's right-hand side: one value, an anonymous set, or a
    named set of the table (used when its elements are listed and plain)."""
    elements: Sequence[object]
    anonymous = _mapping(right)
    if isinstance(right, str) and right.startswith("@"):
        named = table.sets.get(right[1:])
        if named is None or named.elements is None or named.is_map:
            return None
        elements = named.elements
    elif anonymous is not None and "set" in anonymous:
        listed = anonymous["set"]
        elements = listed if isinstance(listed, list) else [listed]
    else:
        elements = [right]
    return _any_of(_element_equal(kind, actual, element) for element in elements)


def _any_of(truths: Iterator[Truth]) -> Truth:
    result: Truth = False
    for truth in truths:
        if truth is True:
            return True
        if truth is None:
            result = None
    return result


def _negate(truth: Truth) -> Truth:
    return None if truth is None else not truth


def _evaluate_match(body: _Json, table: NftTable, seen: PacketAtHook) -> Truth:
    kind, actual = _field(body.get("left"), seen)
    if kind == "mismatch":
        return False
    if kind == "unknown" or actual is None:
        return None
    op, right = str(body.get("op", "==")), body.get("right")
    if kind == "flags" and op == "in" and isinstance(actual, int):
        # `tcp flags syn`: nft's implicit flag test, true when any of the listed flags is set.
        flags = _flags_value(right)
        return None if flags is None else bool(actual & flags)
    if op in ("==", "in"):
        return _any_equal(kind, actual, right, table)
    if op == "!=":
        return _negate(_any_equal(kind, actual, right, table))
    if op in ("<", ">", "<=", ">=") and isinstance(actual, int):
        bound = _number(kind, right)
        if bound is None:
            return None
        return {"<": actual < bound, ">": actual > bound, "<=": actual <= bound, ">=": actual >= bound}[op]
    return None


def _verdict_outcome(key: str, value: object, truth: Truth) -> NftOutcome:
    target = _mapping(value)
    name = target.get("target") if target else None
    return NftOutcome(truth, _VERDICT_KINDS[key], str(name) if name is not None else None)


def _vmap_outcomes(body: _Json, table: NftTable, seen: PacketAtHook, truth: Truth) -> list[NftOutcome]:
    """`udp dport vmap { 4000 : drop, ... }`: the entry the packet's key selects; every entry is possible
    when the key cannot be read from the packet, none (the rule does not match) when no entry fits."""
    kind, actual = _field(body.get("key"), seen)
    if kind == "mismatch":
        return []
    data = body.get("data")
    entries: Sequence[object] = ()
    if isinstance(data, str) and data.startswith("@"):
        named = table.sets.get(data[1:])
        if named is not None and named.elements is not None:
            entries = named.elements
    else:
        inner = _mapping(data)
        listed = inner.get("set") if inner else None
        entries = listed if isinstance(listed, list) else []
    outcomes = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and _mapping(entry[1])):
            continue
        verdict_key, verdict_value = _single(entry[1])
        if verdict_key not in _VERDICT_KINDS:
            continue
        hit = None if kind == "unknown" or actual is None else _element_equal(kind, actual, entry[0])
        if hit is True:
            return [_verdict_outcome(verdict_key, verdict_value, truth)]
        if hit is None:
            outcomes.append(_verdict_outcome(verdict_key, verdict_value, None))
    return outcomes


def rule_outcomes(rule: NftRule, table: NftTable, seen: PacketAtHook) -> list[NftOutcome]:
    """What the rule may do to the packet, in statement order. Empty when it certainly does not match; a
    "continue" outcome when it matches without a verdict (counter or log only)."""
    truth: Truth = True
    for statement in rule.statements:
        key, value = _single(statement)
        if key == "match":
            body = _mapping(value)
            truth = all_of((truth, _evaluate_match(body, table, seen) if body is not None else None))
            if truth is False:
                return []
        elif key in _VERDICT_KINDS:
            return [_verdict_outcome(key, value, truth)]
        elif key == "vmap":
            # A key without an entry ends the rule (NFT_BREAK), so no outcome at all is right then.
            vmap = _mapping(value)
            return _vmap_outcomes(vmap, table, seen, truth) if vmap is not None else []
        elif key == "xt":
            xt = _mapping(value) or {}
            target = str(xt.get("name", ""))
            if xt.get("type") == "target" and target in _XT_DROP_TARGETS:
                return [NftOutcome(truth, "drop")]
            if xt.get("type") == "target" and target in _XT_ACCEPT_TARGETS:
                return [NftOutcome(truth, "accept")]
            if xt.get("type") != "target":
                truth = all_of((truth, None))
        elif key not in _PLAIN_STATEMENTS:
            # limit, quota, ct count, meter, tproxy and anything newer: a condition we cannot evaluate.
            truth = all_of((truth, None))
    return [NftOutcome(truth, "continue")]


# --- text ------------------------------------------------------------------------------------------------


def _render_value(value: object, quote: bool = False) -> str:
    body = _mapping(value)
    if body is not None:
        kind, inner = _single(body)
        if kind == "set":
            items = inner if isinstance(inner, list) else [inner]
            return "{ " + ", ".join(_render_value(item, quote) for item in items) + " }"
        if kind == "prefix" and _mapping(inner):
            prefix = _mapping(inner) or {}
            return f"{prefix.get('addr')}/{prefix.get('len')}"
        if kind == "range" and isinstance(inner, list) and len(inner) == 2:
            return f"{_render_value(inner[0])}-{_render_value(inner[1])}"
        if kind == "concat" and isinstance(inner, list):
            return " . ".join(_render_value(item, quote) for item in inner)
        if kind == "elem" and _mapping(inner):
            return _render_value((_mapping(inner) or {}).get("val"), quote)
        if kind in ("payload", "meta", "ct", "&", "|"):
            return _render_expression(body)
        if kind in _VERDICT_KINDS:
            return _render_verdict(kind, inner)
        return kind
    if isinstance(value, list):
        if len(value) == 2 and _mapping(value[1]) is not None and not isinstance(value[0], list):
            return f"{_render_value(value[0])} : {_render_value(value[1])}"
        return ",".join(_render_value(item, quote) for item in value)
    if isinstance(value, str) and quote:
        return f'"{value}"'
    return str(value)


def _render_expression(expression: object) -> str:
    body = _mapping(expression)
    if body is None:
        return _render_value(expression)
    kind, value = _single(body)
    inner = _mapping(value) or {}
    if kind == "payload":
        if "protocol" in inner:
            return f"{inner['protocol']} {inner.get('field')}"
        return f"@{inner.get('base')},{inner.get('offset')},{inner.get('len')}"
    if kind == "meta":
        key = str(inner.get("key"))
        return key if key in _BARE_META_KEYS else f"meta {key}"
    if kind == "ct":
        direction = f" {inner['dir']}" if "dir" in inner else ""
        return f"ct{direction} {inner.get('key')}"
    if kind == "fib":
        flags = inner.get("flags", [])
        flag_text = " . ".join(flags) if isinstance(flags, list) else str(flags)
        return f"fib {flag_text} {inner.get('result')}"
    if kind in ("&", "|", "^") and isinstance(value, list) and len(value) == 2:
        return f"{_render_expression(value[0])} {kind} {_render_value(value[1])}"
    if kind == "concat" and isinstance(value, list):
        return " . ".join(_render_expression(item) for item in value)
    return kind


def _render_match(body: _Json) -> str:
    left, right, op = body.get("left"), body.get("right"), str(body.get("op", "=="))
    left_body = _mapping(left) or {}
    masked = left_body.get("&")
    if isinstance(masked, list) and len(masked) == 2 and op == "==":
        field = _render_expression(masked[0])
        if field == "tcp flags":
            # nft >= 1.0 prints `tcp flags & (syn | ack) == syn` as `tcp flags syn / syn,ack`.
            return f"{field} {_render_value(right)} / {_render_value(masked[1])}"
        return f"{field} & {_render_value(masked[1])} == {_render_value(right)}"
    field = _render_expression(left)
    meta = _mapping(left_body.get("meta")) or {}
    key = str(meta.get("key"))
    if field == "tcp flags" and op == "==" and isinstance(right, int):
        # An exact flags comparison keeps its `==` (a bare `tcp flags syn` is a flag test); nft prints the
        # value in hex.
        return f"{field} == 0x{right:02x}"
    if key == "mark" and isinstance(right, int):
        return f"{field} {'' if op == '==' else op + ' '}0x{right:08x}"
    operator = "" if op in ("==", "in") else f"{op} "
    return f"{field} {operator}{_render_value(right, key in _IFNAME_KEYS)}"


def _render_verdict(key: str, value: object) -> str:
    target = _mapping(value)
    if key in ("jump", "goto") and target is not None:
        return f"{key} {target.get('target')}"
    return key


def _render_reject(value: object, family: str) -> str:
    body = _mapping(value)
    if body is None:
        return "reject"
    kind, reason = body.get("type"), body.get("expr")
    if kind == "tcp reset":
        return "reject with tcp reset"
    default = {"inet": "icmpx", "bridge": "icmpx", "netdev": "icmpx", "ip": "icmp", "ip6": "icmpv6"}
    if reason in (None, "port-unreachable") and kind == default.get(family):
        return "reject"
    return f"reject with {kind} {reason}" if reason else f"reject with {kind}"


def _render_statement(statement: _Json, family: str) -> str:
    key, value = _single(statement)
    body = _mapping(value) or {}
    if key == "match":
        return _render_match(body)
    if key == "counter":
        return "counter" if body or value is None else f"counter name {_render_value(value, True)}"
    if key == "reject":
        return _render_reject(value, family)
    if key in ("accept", "drop", "continue", "return", "jump", "goto"):
        return _render_verdict(key, value)
    if key == "vmap":
        return f"{_render_expression(body.get('key'))} vmap {_render_value(body.get('data'))}"
    if key == "log":
        parts = ["log"]
        if "prefix" in body:
            parts.append(f'prefix "{body["prefix"]}"')
        if "level" in body:
            parts.append(f"level {body['level']}")
        return " ".join(parts)
    if key == "limit":
        per = body.get("per", "second")
        over = "over " if body.get("inv") else ""
        burst = f" burst {body['burst']} packets" if body.get("burst", 5) != 5 else ""
        return f"limit rate {over}{body.get('rate')}/{per}{burst}"
    if key in ("masquerade", "notrack"):
        return key
    if key in ("snat", "dnat", "redirect"):
        family_word = f" {body['family']}" if "family" in body else ""
        address = f" {body['addr']}" if "addr" in body else ""
        port = f":{body['port']}" if "port" in body else ""
        return f"{key}{family_word} to{address}{port}" if address or port else key
    if key == "quota":
        over = "over " if body.get("inv") else ""
        return f"quota {over}{body.get('val')} {body.get('val_unit', 'bytes')}"
    if key == "xt":
        return f'xt {body.get("type")} "{body.get("name")}"'
    return key


def render_rule(rule: NftRule) -> str:
    """The rule text from its JSON, close to what `nft -a -s list` prints; used when asking nft itself for
    the line fails (the chain changed meanwhile). Ends with `# handle N` like nft's."""
    parts = [_render_statement(statement, rule.family) for statement in rule.statements]
    if rule.comment is not None:
        parts.append(f'comment "{rule.comment}"')
    return " ".join(part for part in parts if part) + f" # handle {rule.handle}"
