"""A namespace's IPv4 and IPv6 policy routing, read over rtnetlink (pyroute2), and which rule and route
explain one of the kernel's route lookups.

The kernel's fib:fib_table_lookup and fib6:fib6_table_lookup tracepoints say which table was searched and
with what result, but not which `ip rule` sent the lookup there nor which prefix matched. Both follow from
the namespace's rules and routes of the lookup's family (each family has its own rules, `ip rule` and `ip -6
rule`, and its own routes in tables of the same ids): the rule is the first one, by priority, whose
selectors match the flow and whose action is "lookup <that table>" (net/core/fib_rules.c
fib_rules_lookup); the route is the longest prefix of that table that contains the destination
(net/ipv4/fib_trie.c, net/ipv6/ip6_fib.c). Messages are turned into plain dicts first (`rule_fields`,
`route_fields`, `link_fields`) so the matching runs on recorded fixtures too.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LookupKey",
    "PolicyRule",
    "PolicySnapshot",
    "RouteEntry",
    "read_policy",
    "snapshot_from_fields",
]

# include/uapi/linux/rtnetlink.h enum rt_class_t and RTN_*; the names `ip route` prints.
TABLE_NAMES = {253: "default", 254: "main", 255: "local"}
ROUTE_TYPES = {
    1: "unicast",
    2: "local",
    3: "broadcast",
    4: "anycast",
    5: "multicast",
    6: "blackhole",
    7: "unreachable",
    8: "prohibit",
    9: "throw",
    10: "nat",
}
_FR_ACT_TO_TBL = 1  # include/uapi/linux/fib_rules.h: FR_ACT_TO_TBL; 2 goto, 3 nop, 6 blackhole, 7 unreachable
_RULE_ACTIONS = {1: "lookup", 2: "goto", 3: "nop", 6: "blackhole", 7: "unreachable", 8: "prohibit"}
_FIB_RULE_INVERT = 0x2
# The rules a namespace starts with: local, main, default for IPv4; local, main for IPv6
# (net/ipv6/fib6_rules.c fib6_default_rules_init).
_DEFAULT_RULES = {socket.AF_INET: 3, socket.AF_INET6: 2}

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def table_name(table: int) -> str:
    return TABLE_NAMES.get(table, str(table))


@dataclass(frozen=True)
class PolicyRule:
    """One `ip rule`: its selectors and what it does."""

    priority: int
    action: int
    table: int
    src: IpNetwork | None = None
    dst: IpNetwork | None = None
    iif: str | None = None
    oif: str | None = None
    fwmark: int | None = None
    fwmask: int = 0xFFFFFFFF
    tos: int = 0
    ip_proto: int | None = None
    sport: tuple[int, int] | None = None
    dport: tuple[int, int] | None = None
    invert: bool = False
    family: int = socket.AF_INET  # AF_INET rules steer IPv4 lookups only, AF_INET6 ones IPv6 lookups

    def matches(self, key: LookupKey, ifnames: Mapping[int, str]) -> bool:
        """Does the flow meet every selector (fib_rule_match + fib4_rule_match)? `invert` flips the result."""
        return self._selectors_match(key, ifnames) != self.invert

    def _selectors_match(self, key: LookupKey, ifnames: Mapping[int, str]) -> bool:
        if self.src is not None and ipaddress.ip_address(key.src) not in self.src:
            return False
        if self.dst is not None and ipaddress.ip_address(key.dst) not in self.dst:
            return False
        # An output lookup's iif is the loopback device (flowi4_iif = LOOPBACK_IFINDEX): `iif lo` rules match
        # locally generated traffic, as `ip rule` documents.
        if self.iif is not None and ifnames.get(key.iif) != self.iif:
            return False
        if self.oif is not None and ifnames.get(key.oif) != self.oif:
            return False
        if self.fwmark is not None and (key.mark ^ self.fwmark) & self.fwmask:
            return False
        if self.ip_proto is not None and key.proto != self.ip_proto:
            return False
        if self.sport is not None and not self.sport[0] <= key.sport <= self.sport[1]:
            return False
        return self.dport is None or self.dport[0] <= key.dport <= self.dport[1]

    @property
    def text(self) -> str:
        """As `ip rule` (`ip -6 rule`) prints it: `1000: from 198.18.3.0/24 lookup 100`."""
        parts = [f"{self.priority}:"]
        if self.invert:
            parts.append("not")
        parts += ["from", str(self.src) if self.src is not None else "all"]
        if self.dst is not None:
            parts += ["to", str(self.dst)]
        if self.tos:
            parts += ["tos", f"0x{self.tos:02x}"]
        if self.fwmark is not None:
            mark = f"0x{self.fwmark:x}"
            parts += ["fwmark", mark if self.fwmask == 0xFFFFFFFF else f"{mark}/0x{self.fwmask:x}"]
        if self.iif is not None:
            parts += ["iif", self.iif]
        if self.oif is not None:
            parts += ["oif", self.oif]
        if self.ip_proto is not None:
            parts += ["ipproto", str(self.ip_proto)]
        for name, ports in (("sport", self.sport), ("dport", self.dport)):
            if ports is not None:
                parts += [name, str(ports[0]) if ports[0] == ports[1] else f"{ports[0]}-{ports[1]}"]
        action = _RULE_ACTIONS.get(self.action, f"action {self.action}")
        parts.append(f"lookup {table_name(self.table)}" if self.action == _FR_ACT_TO_TBL else action)
        return " ".join(parts)


@dataclass(frozen=True)
class RouteEntry:
    """One route of one table."""

    table: int
    dst: IpNetwork
    type: int
    gateway: str | None = None
    dev: str | None = None
    priority: int = 0
    tos: int = 0

    @property
    def type_name(self) -> str:
        return ROUTE_TYPES.get(self.type, str(self.type))

    @property
    def text(self) -> str:
        """As `ip route` prints it: `blackhole 198.18.5.0/24`, `default via 198.18.0.1 dev v0`"""
        prefix = "default" if self.dst.prefixlen == 0 else str(self.dst)
        parts = [] if self.type == 1 else [self.type_name]
        parts.append(prefix)
        if self.gateway:
            parts += ["via", self.gateway]
        if self.dev:
            parts += ["dev", self.dev]
        if self.priority:
            parts += ["metric", str(self.priority)]
        return " ".join(parts)


@dataclass(frozen=True)
class LookupKey:
    """What the kernel looked up (struct flowi4 or flowi6): addresses as text, interfaces as indexes."""

    dst: str
    src: str = "0.0.0.0"
    iif: int = 0
    oif: int = 0
    mark: int = 0
    proto: int = 0
    sport: int = 0
    dport: int = 0

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ipaddress.ip_address(self.dst).version == 6 else socket.AF_INET


@dataclass(frozen=True)
class PolicySnapshot:
    """The rules, the routes of every table and the interface names of one namespace."""

    rules: tuple[PolicyRule, ...]
    routes: Mapping[int, tuple[RouteEntry, ...]]
    ifnames: Mapping[int, str] = field(default_factory=dict)

    @property
    def has_custom_rules(self) -> bool:
        """More than a family's default rules (local, main, and for IPv4 default)."""
        if any(rule.table not in TABLE_NAMES or rule.src or rule.dst for rule in self.rules):
            return True
        return any(
            sum(rule.family == family for rule in self.rules) > defaults
            for family, defaults in _DEFAULT_RULES.items()
        )

    def rule_for(self, key: LookupKey, table: int) -> PolicyRule | None:
        """The first rule of the lookup's family, by priority, matching the flow and sending it to `table`."""
        family = key.family
        for rule in self.rules:
            if (
                rule.family == family
                and rule.action == _FR_ACT_TO_TBL
                and rule.table == table
                and rule.matches(key, self.ifnames)
            ):
                return rule
        return None

    def route_for(self, table: int, dst: str, want_types: Iterable[int] = ()) -> RouteEntry | None:
        """The longest prefix of `table` holding `dst` (routes of the other family never do); among equal
        prefixes one of `want_types` (the type the kernel's result says it was), else the lowest metric."""
        address = ipaddress.ip_address(dst)
        wanted = set(want_types)
        best: RouteEntry | None = None
        for route in self.routes.get(table, ()):
            if address not in route.dst:
                continue
            if best is None or _better(route, best, wanted):
                best = route
        return best


def _better(route: RouteEntry, best: RouteEntry, wanted: set[int]) -> bool:
    if route.dst.prefixlen != best.dst.prefixlen:
        return route.dst.prefixlen > best.dst.prefixlen
    if wanted and (route.type in wanted) != (best.type in wanted):
        return route.type in wanted
    return route.priority < best.priority


# -- reading -----------------------------------------------------------------------------------------------


def _network(address: str | None, length: int) -> IpNetwork | None:
    if address is None or not length:
        return None
    return ipaddress.ip_network(f"{address}/{length}", strict=False)


def _port_range(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, str) and ":" in value:  # pyroute2 0.9 decodes struct fib_rule_port_range as "53:53"
        start, end = value.split(":", 1)
        return int(start), int(end)
    if isinstance(value, Mapping):
        return int(value.get("start", 0)), int(value.get("end", 0))
    if isinstance(value, Sequence) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def rule_fields(message: Any) -> dict[str, Any]:
    """The parts of one RTM_NEWRULE message the matching needs, as plain data."""
    get = message.get_attr
    return {
        "family": message["family"],
        "priority": get("FRA_PRIORITY") or 0,
        "action": message["action"],
        "table": get("FRA_TABLE") or message["table"],
        "src": get("FRA_SRC"),
        "src_len": message["src_len"],
        "dst": get("FRA_DST"),
        "dst_len": message["dst_len"],
        "iif": get("FRA_IIFNAME"),
        "oif": get("FRA_OIFNAME"),
        "fwmark": get("FRA_FWMARK"),
        "fwmask": get("FRA_FWMASK"),
        "tos": message["tos"],
        "ip_proto": get("FRA_IP_PROTO"),
        "sport": _port_range(get("FRA_SPORT_RANGE")),
        "dport": _port_range(get("FRA_DPORT_RANGE")),
        "flags": message["flags"],
    }


def route_fields(message: Any) -> dict[str, Any]:
    get = message.get_attr
    family = message["family"]
    return {
        "family": family,
        "table": get("RTA_TABLE") or message["table"],
        "dst": get("RTA_DST") or ("::" if family == socket.AF_INET6 else "0.0.0.0"),
        "dst_len": message["dst_len"],
        "type": message["type"],
        "gateway": get("RTA_GATEWAY"),
        "oif": get("RTA_OIF"),
        "priority": get("RTA_PRIORITY") or 0,
        "tos": message["tos"],
    }


def link_fields(message: Any) -> tuple[int, str]:
    return int(message["index"]), str(message.get_attr("IFLA_IFNAME"))


def snapshot_from_fields(
    rules: Iterable[Mapping[str, Any]], routes: Iterable[Mapping[str, Any]], links: Iterable[tuple[int, str]]
) -> PolicySnapshot:
    """A snapshot from plain data (what `read_policy` reads, or a recorded fixture)."""
    ifnames = dict(links)
    parsed_rules = sorted(
        (
            PolicyRule(
                priority=int(fields["priority"]),
                action=int(fields["action"]),
                table=int(fields["table"]),
                src=_network(fields.get("src"), int(fields.get("src_len") or 0)),
                dst=_network(fields.get("dst"), int(fields.get("dst_len") or 0)),
                iif=fields.get("iif"),
                oif=fields.get("oif"),
                fwmark=fields.get("fwmark") if fields.get("fwmark") or fields.get("fwmask") else None,
                fwmask=int(fields.get("fwmask") or 0xFFFFFFFF),
                tos=int(fields.get("tos") or 0),
                ip_proto=fields.get("ip_proto"),
                sport=tuple(fields["sport"]) if fields.get("sport") else None,
                dport=tuple(fields["dport"]) if fields.get("dport") else None,
                invert=bool(int(fields.get("flags") or 0) & _FIB_RULE_INVERT),
                family=int(fields.get("family") or socket.AF_INET),  # recordings before IPv6 lack it
            )
            for fields in rules
        ),
        key=lambda rule: rule.priority,
    )
    by_table: dict[int, list[RouteEntry]] = {}
    for fields in routes:
        oif = fields.get("oif")
        entry = RouteEntry(
            table=int(fields["table"]),
            dst=ipaddress.ip_network(f"{fields['dst']}/{fields['dst_len']}", strict=False),
            type=int(fields["type"]),
            gateway=fields.get("gateway"),
            dev=ifnames.get(int(oif)) if oif else None,
            priority=int(fields.get("priority") or 0),
            tos=int(fields.get("tos") or 0),
        )
        by_table.setdefault(entry.table, []).append(entry)
    return PolicySnapshot(
        tuple(parsed_rules), {table: tuple(entries) for table, entries in by_table.items()}, ifnames
    )


def _read_here() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[int, str]]]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        rules: list[dict[str, Any]] = []
        routes: list[dict[str, Any]] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            rules += [rule_fields(message) for message in ipr.get_rules(family=family)]
            routes += [route_fields(message) for message in ipr.get_routes(family=family)]
        links = [link_fields(message) for message in ipr.get_links()]
    return rules, routes, links


def read_policy(netns_path: str | None) -> PolicySnapshot:
    """The policy routing of the namespace at `netns_path` (this process's own when None), read over
    rtnetlink from inside it (a forked helper enters it, so this process never changes namespace)."""
    from netsleuth.kernel.netns_exec import call_in_netns

    rules, routes, links = call_in_netns(netns_path, _read_here)
    return snapshot_from_fields(rules, routes, links)
