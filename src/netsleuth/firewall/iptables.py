"""iptables rules (nft and legacy backends) as `iptables-save -c` prints them, and how a rule judges a packet.

Parsing iptables-save output is deliberate: it is iptables' own persistence format, written to be read back
by iptables-restore, so it is stable across versions, and each `-A CHAIN ...` line is exactly the rule text
the user wrote and wants to see. `iptables -L` output, by contrast, is for humans and changes freely.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netsleuth.firewall.hooks import PacketAtHook, Truth, VerdictKind, all_of
from netsleuth.kernel.netns_exec import read_file_in_netns, run_in_netns
from netsleuth.packet import proto_number

__all__ = [
    "BACKEND_LEGACY",
    "BACKEND_NFT",
    "IptablesChain",
    "IptablesRule",
    "IptablesRuleset",
    "IptablesTable",
    "chain_priority",
    "hook_chain_name",
    "parse_iptables_save",
    "read_iptables",
]

BACKEND_NFT = "iptables-nft"
BACKEND_LEGACY = "iptables-legacy"

# Hook priorities of the built-in tables: include/uapi/linux/netfilter_ipv4.h `enum nf_ip_hook_priorities`
# (netfilter_ipv6.h has the same values). nat registers DNAT at NF_IP_PRI_NAT_DST (-100) on PREROUTING and
# OUTPUT, SNAT at NF_IP_PRI_NAT_SRC (100) on INPUT and POSTROUTING (net/netfilter/nf_nat_proto.c).
_TABLE_PRIORITY = {"raw": -300, "mangle": -150, "nat": -100, "filter": 0, "security": 50}
_NAT_SRC_CHAINS = frozenset({"INPUT", "POSTROUTING"})

_TERMINAL_DROP = frozenset({"DROP", "REJECT"})
# Targets that end the traversal of this table without dropping: NAT targets return NF_ACCEPT, queueing
# hands the packet to user space (a user-space drop does not come back through nf_hook_slow).
_TERMINAL_ACCEPT = frozenset(
    {"ACCEPT", "DNAT", "SNAT", "MASQUERADE", "REDIRECT", "NETMAP", "QUEUE", "NFQUEUE", "SYNPROXY"}
)

_INCOMPATIBLE = re.compile(r"^# Table `([^']+)' .*incompatible")
_CHAIN_LINE = re.compile(r"^:(\S+) (\S+)(?: \[(\d+):(\d+)\])?\s*$")
_RULE_LINE = re.compile(r"^(?:\[(\d+):(\d+)\] )?(-A (\S+)(?: .*)?)$")

# Number of arguments of the match options this module understands; anything else takes the arguments
# up to the next option (which is what iptables-save prints for every extension).
_ARITY = {
    "--tcp-flags": 2,
    "--syn": 0,
    "--comment": 1,
    "--icmp-type": 1,
    "--icmpv6-type": 1,
    "-f": 0,
    "--fragment": 0,
}
_SOURCE_OPTIONS = frozenset({"-s", "--source", "--src"})
_DESTINATION_OPTIONS = frozenset({"-d", "--destination", "--dst"})
_PORT_MODULES = frozenset({"tcp", "udp", "udplite", "sctp", "dccp"})
_SPORT_OPTIONS = frozenset({"--sport", "--source-port"})
_DPORT_OPTIONS = frozenset({"--dport", "--destination-port"})
_MULTIPORT_FIELDS = {
    "--sports": "sport",
    "--source-ports": "sport",
    "--dports": "dport",
    "--destination-ports": "dport",
    "--ports": "either",
}
# extensions/libxt_tcp.c: flag names accepted by --tcp-flags.
_TCP_FLAG_BITS = {
    "FIN": 0x01,
    "SYN": 0x02,
    "RST": 0x04,
    "PSH": 0x08,
    "ACK": 0x10,
    "URG": 0x20,
    "ALL": 0x3F,
    "NONE": 0,
}
# /etc/protocols names iptables-save prints that netsleuth.packet does not know.
_PROTOCOL_ALIASES = {"ipv6-icmp": 58, "icmp6": 58, "all": 0, "encap": 98, "mh": 135, "ipv6-mh": 135}


@dataclass(frozen=True)
class _AddressMatch:
    source: bool
    address: int
    mask: int
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        text = seen.packet.saddr if self.source else seen.packet.daddr
        if text is None:
            return None
        inside = int(ipaddress.ip_address(text)) & self.mask == self.address & self.mask
        return inside != self.negated


@dataclass(frozen=True)
class _ProtocolMatch:
    number: int
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        if self.number == 0:  # "all"
            return not self.negated
        return (seen.packet.proto == self.number) != self.negated


@dataclass(frozen=True)
class _InterfaceMatch:
    inbound: bool
    name: str
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        actual = seen.in_ifname if self.inbound else seen.out_ifname
        if actual is None:
            return None
        # iptables(8): "If the interface name ends in a "+", then any interface which begins with this name
        # will match." A hook without that device compares an empty name, which matches nothing.
        if self.name.endswith("+"):
            hit = bool(actual) and actual.startswith(self.name[:-1])
        else:
            hit = actual == self.name
        return hit != self.negated


@dataclass(frozen=True)
class _PortMatch:
    field: str  # "sport", "dport" or "either" (multiport --ports)
    ranges: tuple[tuple[int, int], ...]
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        ports = {
            "sport": (seen.packet.sport,),
            "dport": (seen.packet.dport,),
            "either": (seen.packet.sport, seen.packet.dport),
        }[self.field]
        if any(port is None for port in ports):
            return None
        hit = any(low <= port <= high for port in ports if port is not None for low, high in self.ranges)
        return hit != self.negated


@dataclass(frozen=True)
class _TcpFlagsMatch:
    mask: int
    compare: int
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        if seen.packet.tcp_flags is None:
            return None
        return (seen.packet.tcp_flags & self.mask == self.compare) != self.negated


@dataclass(frozen=True)
class _IcmpMatch:
    icmp_type: int | None  # None: "any"
    code: int | None
    negated: bool

    def evaluate(self, seen: PacketAtHook) -> Truth:
        if self.icmp_type is None:
            return not self.negated
        if seen.packet.icmp_type is None:
            return None
        hit = seen.packet.icmp_type == self.icmp_type
        if hit and self.code is not None:
            if seen.packet.icmp_code is None:
                return None
            hit = seen.packet.icmp_code == self.code
        return hit != self.negated


@dataclass(frozen=True)
class _UnknownMatch:
    """A match the packet tuple cannot decide (conntrack state, marks, owner, sets, limits...)."""

    text: str

    def evaluate(self, seen: PacketAtHook) -> Truth:
        return None


_Match = (
    _AddressMatch
    | _ProtocolMatch
    | _InterfaceMatch
    | _PortMatch
    | _TcpFlagsMatch
    | _IcmpMatch
    | _UnknownMatch
)


@dataclass(frozen=True)
class IptablesRule:
    """One `-A` line. `text` is the line as iptables-save prints it, without the `[pkts:bytes]` prefix;
    `number` is its 1-based position in the chain, as `iptables -L --line-numbers` counts."""

    chain: str
    number: int
    text: str
    packets: int | None
    bytes: int | None
    matches: tuple[_Match, ...]
    target: str | None
    kind: VerdictKind

    def evaluate(self, seen: PacketAtHook) -> Truth:
        """Whether every match of the rule holds for the packet (None when some cannot be decided)."""
        return all_of(match.evaluate(seen) for match in self.matches)


@dataclass(frozen=True)
class IptablesChain:
    name: str
    policy: str | None  # None for user-defined chains
    packets: int | None  # the policy counter of a built-in chain
    bytes: int | None
    rules: tuple[IptablesRule, ...]


@dataclass(frozen=True)
class IptablesTable:
    name: str
    chains: Mapping[str, IptablesChain]


@dataclass(frozen=True)
class IptablesRuleset:
    """Everything one `*tables-save` printed: one backend, one family (4 or 6)."""

    backend: str
    family: int
    tables: Mapping[str, IptablesTable]

    @property
    def nft_family(self) -> str:
        """The nftables family these tables live in (iptables-nft) or mirror (legacy)."""
        return "ip" if self.family == 4 else "ip6"


def chain_priority(table: str, chain: str) -> int:
    """The hook priority a built-in chain of `table` runs at."""
    if table == "nat" and chain in _NAT_SRC_CHAINS:
        return 100
    return _TABLE_PRIORITY.get(table, 0)


def hook_chain_name(hook: str) -> str | None:
    """The built-in chain iptables attaches to `hook` ("input" → "INPUT"); None for non-IP hooks."""
    return hook.upper() if hook in ("prerouting", "input", "forward", "output", "postrouting") else None


def _parse_ports(text: str) -> tuple[tuple[int, int], ...]:
    """`22`, `1000:2000`, `1000:`, `:2000`, and comma lists of those (multiport)."""
    ranges = []
    for part in text.split(","):
        low, sep, high = part.partition(":")
        if sep:
            ranges.append((int(low or 0), int(high or 65535)))
        else:
            ranges.append((int(part), int(part)))
    return tuple(ranges)


def _parse_address(text: str, source: bool, negated: bool) -> _AddressMatch:
    """`198.18.0.0/15`, `2001:db8::/32`, or a dotted mask as iptables-save prints non-contiguous ones."""
    address, _, mask_text = text.partition("/")
    ip = ipaddress.ip_address(address)
    width = ip.max_prefixlen
    if not mask_text:
        mask = (1 << width) - 1
    elif mask_text.isdigit():
        mask = ((1 << width) - 1) ^ ((1 << (width - int(mask_text))) - 1)
    else:
        mask = int(ipaddress.ip_address(mask_text))
    return _AddressMatch(source, int(ip), mask, negated)


def _parse_tcp_flags(mask: str, compare: str, negated: bool) -> _TcpFlagsMatch:
    def bits(names: str) -> int:
        total = 0
        for name in names.split(","):
            total |= _TCP_FLAG_BITS[name.upper()]
        return total

    return _TcpFlagsMatch(bits(mask), bits(compare), negated)


def _parse_icmp_type(text: str, negated: bool) -> _Match:
    if text == "any":
        return _IcmpMatch(None, None, negated)
    type_text, _, code_text = text.partition("/")
    if not type_text.isdigit() or (code_text and not code_text.isdigit()):
        # iptables-save prints numbers; a name here is from a hand-written file: do not guess its number.
        return _UnknownMatch(f"--icmp-type {text}")
    return _IcmpMatch(int(type_text), int(code_text) if code_text else None, negated)


def _make_match(module: str | None, option: str, args: Sequence[str], negated: bool) -> _Match | None:
    """The match for one option; None for options that never constrain (comments)."""
    text = " ".join(["!"] * negated + [option, *args])
    try:
        if option in _SOURCE_OPTIONS or option in _DESTINATION_OPTIONS:
            return _parse_address(args[0], option in _SOURCE_OPTIONS, negated)
        if option in ("-p", "--protocol"):
            number = _PROTOCOL_ALIASES.get(args[0].lower(), proto_number(args[0]))
            return _UnknownMatch(text) if number is None else _ProtocolMatch(number, negated)
        if option in ("-i", "--in-interface", "-o", "--out-interface"):
            return _InterfaceMatch(option in ("-i", "--in-interface"), args[0], negated)
        if module in _PORT_MODULES and (option in _SPORT_OPTIONS or option in _DPORT_OPTIONS):
            field = "sport" if option in _SPORT_OPTIONS else "dport"
            return _PortMatch(field, _parse_ports(args[0]), negated)
        if module == "multiport" and option in _MULTIPORT_FIELDS:
            return _PortMatch(_MULTIPORT_FIELDS[option], _parse_ports(args[0]), negated)
        if module == "tcp" and option == "--tcp-flags":
            return _parse_tcp_flags(args[0], args[1], negated)
        if module == "tcp" and option == "--syn":
            return _parse_tcp_flags("FIN,SYN,RST,ACK", "SYN", negated)
        if (module == "icmp" and option == "--icmp-type") or (
            module in ("icmp6", "icmpv6") and option == "--icmpv6-type"
        ):
            return _parse_icmp_type(args[0], negated)
        if module == "comment":
            return None
    except (IndexError, KeyError, ValueError):
        pass
    return _UnknownMatch(text)


def _option_arguments(tokens: Sequence[str], start: int, option: str) -> list[str]:
    arity = _ARITY.get(option)
    if arity is not None:
        return list(tokens[start : start + arity])
    args = []
    for token in tokens[start:]:
        if token == "!" or (token.startswith("-") and len(token) > 1 and not token[1].isdigit()):
            break
        args.append(token)
    return args


def _parse_rule_body(tokens: Sequence[str]) -> tuple[tuple[_Match, ...], str | None, bool]:
    """The matches, the target and whether it is a goto, from the tokens after `-A CHAIN`."""
    matches: list[_Match] = []
    module: str | None = None
    negated = False
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token == "!":
            negated = True
            index += 1
            continue
        if token in ("-j", "--jump", "-g", "--goto"):
            # Target options follow the target; they change what it does, not which packets match.
            target = tokens[index + 1] if index + 1 < len(tokens) else None
            return tuple(matches), target, token in ("-g", "--goto")
        if token in ("-m", "--match"):
            module = tokens[index + 1] if index + 1 < len(tokens) else None
            index += 2
            negated = False
            continue
        args = _option_arguments(tokens, index + 1, token)
        match = _make_match(module, token, args, negated)
        if match is not None:
            matches.append(match)
        negated = False
        index += 1 + len(args)
    return tuple(matches), None, False


def _verdict_kind(target: str | None, goto: bool, chains: Mapping[str, object]) -> VerdictKind:
    if target is None:
        return "continue"
    if target in _TERMINAL_DROP:
        return "drop"
    if target in _TERMINAL_ACCEPT:
        return "accept"
    if target == "RETURN":
        return "return"
    if target in chains:
        return "goto" if goto else "jump"
    return "continue"  # LOG, MARK, CONNMARK, CT, TCPMSS...: they act and let the packet go on


@dataclass
class _TableBuilder:
    name: str
    chain_heads: dict[str, tuple[str | None, int | None, int | None]]
    rules: dict[str, list[IptablesRule]]

    def add_rule(self, line_match: re.Match[str]) -> None:
        packets, byte_count, text, chain = line_match.group(1, 2, 3, 4)
        body = text.split(" ", 2)[2] if text.count(" ") >= 2 else ""
        try:
            matches, target, goto = _parse_rule_body(shlex.split(body))
        except ValueError:  # unbalanced quotes: keep the rule, but it can only ever be a "maybe"
            matches, target, goto = (_UnknownMatch(body),), None, False
        chain_rules = self.rules.setdefault(chain, [])
        chain_rules.append(
            IptablesRule(
                chain=chain,
                number=len(chain_rules) + 1,
                text=text,
                packets=int(packets) if packets is not None else None,
                bytes=int(byte_count) if byte_count is not None else None,
                matches=matches,
                target=target,
                kind=_verdict_kind(target, goto, self.chain_heads),
            )
        )

    def build(self) -> IptablesTable:
        chains = {
            name: IptablesChain(name, policy, packets, byte_count, tuple(self.rules.get(name, ())))
            for name, (policy, packets, byte_count) in self.chain_heads.items()
        }
        return IptablesTable(self.name, chains)


def parse_iptables_save(text: str, backend: str, family: int) -> IptablesRuleset:
    """Parse `iptables-save -c` (or ip6tables-save, either backend) output.

    Tables iptables-nft reports as incompatible (native nft chains in an iptables-named table) are left
    out: iptables-save prints an empty stand-in for them, and the nftables reader covers them instead.
    """
    tables: dict[str, IptablesTable] = {}
    incompatible: set[str] = set()
    builder: _TableBuilder | None = None
    for raw_line in text.splitlines():
        line = raw_line.rstrip()
        if line.startswith("#"):
            found = _INCOMPATIBLE.match(line)
            if found:
                incompatible.add(found.group(1))
        elif line.startswith("*"):
            builder = _TableBuilder(line[1:].strip(), {}, {})
        elif line == "COMMIT" and builder is not None:
            if builder.name not in incompatible:
                tables[builder.name] = builder.build()
            builder = None
        elif builder is not None and line.startswith(":"):
            head = _CHAIN_LINE.match(line)
            if head:
                name, policy, packets, byte_count = head.group(1, 2, 3, 4)
                builder.chain_heads[name] = (
                    None if policy == "-" else policy,
                    int(packets) if packets is not None else None,
                    int(byte_count) if byte_count is not None else None,
                )
        elif builder is not None:
            rule = _RULE_LINE.match(line)
            if rule:
                builder.add_rule(rule)
    return IptablesRuleset(backend, family, tables)


def _find_binary(candidates: Sequence[str], multi_names: Sequence[str]) -> str | None:
    """The first candidate that is this backend: named for it (iptables-nft-save), or the generic name
    resolving to that backend's multi-call binary (iptables-save → xtables-nft-multi)."""
    for name in candidates:
        path = shutil.which(name)
        if path is None:
            continue
        if "-nft-" in name or "-legacy-" in name:
            return name
        if os.path.basename(os.path.realpath(path)) in multi_names:
            return name
    return None


def _legacy_tables_loaded(family: int, netns_path: str | None) -> bool:
    """Whether the legacy backend has any table in the namespace. ip_tables registers
    /proc/net/ip_tables_names per namespace; when it is missing or empty there is nothing to list, and not
    running iptables-legacy-save then also avoids its module autoloading (it asks for iptable_filter...)."""
    names_file = "/proc/self/net/ip_tables_names" if family == 4 else "/proc/self/net/ip6_tables_names"
    names = read_file_in_netns(names_file, netns_path)
    return bool(names and names.strip())


def read_iptables(netns_path: str | None) -> list[IptablesRuleset]:
    """Every iptables ruleset of the namespace: iptables-nft and iptables-legacy, IPv4 and IPv6.

    A backend whose tool is not installed is absent from the list; a backend that is installed but has no
    tables is present with no tables (the matcher uses that to tell iptables-nft tables from native nft).
    """
    rulesets = []
    for family, prefix in ((4, "iptables"), (6, "ip6tables")):
        nft_binary = _find_binary((f"{prefix}-nft-save", f"{prefix}-save"), ("xtables-nft-multi",))
        if nft_binary is not None:
            output = run_in_netns([nft_binary, "-c"], netns_path)
            rulesets.append(parse_iptables_save(output, BACKEND_NFT, family))
        legacy_binary = _find_binary(
            (f"{prefix}-legacy-save", f"{prefix}-save"), ("xtables-legacy-multi", "xtables-multi")
        )
        if legacy_binary is not None:
            output = (
                run_in_netns([legacy_binary, "-c"], netns_path)
                if _legacy_tables_loaded(family, netns_path)
                else ""
            )
            rulesets.append(parse_iptables_save(output, BACKEND_LEGACY, family))
    return rulesets
