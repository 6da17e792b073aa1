"""MTU rules: a tunnel whose MTU plus encapsulation exceeds its underlay's, and veth peers that disagree.

Overheads are the outer headers each tunnel adds to a packet of the tunnel's MTU (seed 003: VXLAN adds
50 bytes = outer IPv4 20 + UDP 8 + VXLAN 8 + inner Ethernet 14; RFC 7348 §4.3 and the kernel's
vxlan_config_apply(), which subtracts VXLAN_HEADROOM/VXLAN6_HEADROOM). L2 tunnels (vxlan, geneve,
gretap) carry the inner Ethernet header; L3 tunnels do not. GRE options add 4 bytes each (RFC 2890).
"""

from __future__ import annotations

from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import mtu_fix
from netsleuth.doctor.model import TunnelRecord
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window
from netsleuth.netns_command import in_netns

__all__ = ["RULES", "tunnel_overhead"]

# kind -> (overhead over IPv4 underlay, over IPv6 underlay)
_BASE_OVERHEAD = {
    "vxlan": (50, 70),
    "geneve": (50, 70),  # without options; options add 4-byte multiples
    "gretap": (38, 58),
    "ip6gretap": (58, 58),
    "erspan": (50, 70),
    "gre": (24, 44),
    "ip6gre": (44, 44),
    "ipip": (20, 40),
    "sit": (20, 20),
    "ip6tnl": (40, 40),
}


def tunnel_overhead(tunnel: TunnelRecord) -> int | None:
    overhead = _BASE_OVERHEAD.get(tunnel.kind)
    if overhead is None:
        return None
    return overhead[1 if tunnel.ipv6 else 0] + tunnel.option_bytes


def check_tunnel_mtu(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    for name, link in snapshot.links.items():
        if link.tunnel is None:
            continue
        overhead = tunnel_overhead(link.tunnel)
        underlay = snapshot.link_by_index(link.tunnel.underlay_index)
        if overhead is None or underlay is None or link.mtu + overhead <= underlay.mtu:
            continue
        fitting = underlay.mtu - overhead
        fix = mtu_fix(name, fitting)
        findings.append(
            Finding(
                id=f"tunnel-mtu:{name}",
                severity=Severity.CRITICAL,
                subject=f"{name} over {underlay.name}",
                title=(
                    f"{name}: MTU {link.mtu} + {overhead} bytes of {link.tunnel.kind} "
                    f"> {underlay.name} MTU {underlay.mtu}"
                ),
                evidence={
                    "tunnel_mtu": link.mtu,
                    "encapsulation_bytes": overhead,
                    "underlay": underlay.name,
                    "underlay_mtu": underlay.mtu,
                    "largest_fitting_mtu": fitting,
                },
                explanation=(
                    f"A full-size packet on {name} becomes {link.mtu + overhead} bytes once encapsulated, "
                    "more than "
                    f"{underlay.name} can send ({underlay.mtu}). Such packets are fragmented or dropped, "
                    "typically "
                    f"as connections that open but stall on the first large transfer. Lower {name}'s MTU to "
                    f"{fitting}, or raise {underlay.name}'s MTU to {link.mtu + overhead} if the whole "
                    "underlay path "
                    f"carries it (`ip link set dev {underlay.name} mtu {link.mtu + overhead}`)."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "tunnel MTU: every tunnel's packets fit its underlay after encapsulation"


def check_veth_mtu(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    seen: set[frozenset[str]] = set()
    for name, link in snapshot.links.items():
        if link.kind != "veth" or link.peer_mtu is None or link.peer_mtu == link.mtu:
            continue
        peer = link.peer_name or f"ifindex {link.link_index}"
        same_netns = link.link_netnsid is None
        pair = frozenset((name, peer))
        # Both ends visible: report once, from the larger end, which is the one to change.
        if same_netns and (pair in seen or link.mtu < link.peer_mtu):
            continue
        seen.add(pair)
        # Lower the larger end: raising the smaller one would let packets out that the rest of its path may
        # not carry. When the larger end is the peer in another namespace, only a command can be offered.
        larger_here = link.mtu > link.peer_mtu
        fix = mtu_fix(name, link.peer_mtu) if larger_here else None
        peer_where = "" if same_netns else " (in another network namespace)"
        peer_command = f"ip link set dev {peer} mtu {link.mtu}"
        # The peer's command carries the peer's namespace; one whose namespace has no name to paste is
        # advice in the explanation, never a command that would act on the wrong namespace.
        peer_netns = None if same_netns else link.peer_netns
        commands: tuple[str, ...] = ()
        if fix:
            commands = fix.commands
        elif same_netns or peer_netns:
            commands = (in_netns(peer_command, peer_netns) if peer_netns else peer_command,)
        unnamed = (
            f" Run `{peer_command}` in the peer's namespace (it has no name to enter it by here)."
            if not commands
            else ""
        )
        findings.append(
            Finding(
                id=f"veth-mtu:{name}",
                severity=Severity.WARNING,
                subject=f"{name} <-> {peer}",
                title=f"veth {name} MTU {link.mtu} but its peer {peer}{peer_where} has {link.peer_mtu}",
                evidence={
                    "mtu": link.mtu,
                    "peer": peer,
                    "peer_mtu": link.peer_mtu,
                    "peer_same_netns": same_netns,
                    "peer_netns": peer_netns,
                },
                explanation=(
                    "The two ends of a veth pair are one wire: a packet the larger end sends that exceeds "
                    "the "
                    "smaller end's MTU is dropped on arrival (veth_xmit -> is_skb_forwardable), silently "
                    "for "
                    "small packets and fatally for full-size ones. Give both ends the same MTU." + unnamed
                ),
                fix_commands=commands,
                persistent=fix.persistent if fix else (),
                actions=fix.actions if fix else (),
            )
        )
    return findings, "veth pairs: both ends have the same MTU"


RULES = [Rule("tunnel-mtu", check_tunnel_mtu), Rule("veth-mtu", check_veth_mtu)]
