"""Offload settings that cost throughput or break forwarding (seed 003; Documentation/networking/
segmentation-offloads.rst, netdev-features.rst).

- GRO off on a NIC: every wire packet walks the stack alone.
- LRO on while forwarding or bridging: LRO merges frames irreversibly, and the merged super-frames cannot
  be re-segmented faithfully when forwarded (the kernel's dev_disable_lro() exists for this reason).
- TSO on a tunnel whose underlay lacks tx-udp_tnl-segmentation: the kernel segments in software (GSO) right
  before the underlay driver, so the tunnel's "TSO" is CPU work, not NIC work.
- Bond slaves that differ from each other: the bond advertises the intersection, and traffic moving to the
  other slave on failover changes behaviour.
"""

from __future__ import annotations

from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import combine, feature_fix
from netsleuth.doctor.model import FeatureState, Snapshot
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["BOND_COMPARED_FEATURES", "RULES", "tunnel_segmentation_feature"]

MIN_RX_PPS_FOR_GRO = 100.0

# The underlay feature that lets the NIC segment each tunnel kind (netdev-features.rst, NETIF_F_GSO_*).
_TUNNEL_SEGMENTATION = {
    "vxlan": "tx-udp_tnl-segmentation",
    "geneve": "tx-udp_tnl-segmentation",
    "gre": "tx-gre-segmentation",
    "gretap": "tx-gre-segmentation",
    "ip6gre": "tx-gre-segmentation",
    "ip6gretap": "tx-gre-segmentation",
    "ipip": "tx-ipxip4-segmentation",
    "sit": "tx-ipxip4-segmentation",
    "ip6tnl": "tx-ipxip6-segmentation",
}
BOND_COMPARED_FEATURES = (
    "rx-gro",
    "rx-lro",
    "tx-tcp-segmentation",
    "tx-tcp6-segmentation",
    "tx-generic-segmentation",
    "tx-scatter-gather",
    "rx-checksum",
    "tx-checksum-ip-generic",
    "tx-checksum-ipv4",
    "tx-checksum-ipv6",
    "tx-udp_tnl-segmentation",
)


def tunnel_segmentation_feature(kind: str) -> str | None:
    return _TUNNEL_SEGMENTATION.get(kind)


def _feature(snapshot: Snapshot, name: str, feature: str) -> FeatureState | None:
    record = snapshot.ethtool.get(name)
    return record.features.get(feature) if record is not None else None


def check_gro_off(window: Window) -> Verdict:
    findings: list[Finding] = []
    for name, device in window.after.devices.items():
        link = window.after.links.get(name)
        is_nic = device.is_physical or (link is not None and link.kind == "bond")
        gro = _feature(window.after, name, "rx-gro")
        if not is_nic or gro is None or gro.active or gro.fixed:
            continue
        fix = feature_fix(name, "rx-gro", True)
        rx_pps = window.link_rate(name, "rx_packets")
        findings.append(
            Finding(
                id=f"gro-off:{name}",
                severity=Severity.WARNING if rx_pps >= MIN_RX_PPS_FOR_GRO else Severity.INFO,
                subject=name,
                title=f"{name}: GRO is off",
                evidence={"rx-gro": "off", "rx_packets_per_s": round(rx_pps, 1)},
                explanation=(
                    "Generic Receive Offload merges consecutive segments of a flow before the stack sees "
                    "them; "
                    f"with it off, {name} pushes every wire packet through IP, netfilter and TCP one by one "
                    "(seed 003: up to several times the CPU per byte). GRO is safe for forwarding, unlike "
                    "LRO."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "GRO: on for every NIC that can do it"


def check_lro_forwarding(window: Window) -> Verdict:
    snapshot = window.after
    forwarding = snapshot.sysctl_int("net.ipv4.ip_forward") == 1 or (
        snapshot.sysctl_int("net.ipv6.conf.all.forwarding") == 1
    )
    findings: list[Finding] = []
    for name, link in snapshot.links.items():
        lro = _feature(snapshot, name, "rx-lro")
        if lro is None or not lro.active:
            continue
        master = snapshot.link_by_index(link.master_index)
        bridged = master is not None and master.kind in ("bridge", "openvswitch")
        if not forwarding and not bridged:
            continue
        why = f"it is a port of bridge {master.name}" if bridged and master else "IP forwarding is on"
        fix = feature_fix(name, "rx-lro", False)
        findings.append(
            Finding(
                id=f"lro-forwarding:{name}",
                severity=Severity.CRITICAL,
                subject=name,
                title=f"{name}: LRO is on while {why}",
                evidence={
                    "rx-lro": "on",
                    "ip_forward": snapshot.sysctls.get("net.ipv4.ip_forward", "?"),
                    "bridged": bridged,
                },
                explanation=(
                    "Large Receive Offload lets the NIC merge frames into one big packet and throws away "
                    "the "
                    "original boundaries; a host that forwards or bridges must resend the original frames, "
                    "which it cannot, so merged packets get dropped or mangled. The kernel disables LRO "
                    "itself "
                    "when it notices forwarding (dev_disable_lro), but not on every path. Use GRO instead."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "LRO: off wherever this host forwards or bridges"


def check_tunnel_segmentation(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    for name, link in snapshot.links.items():
        if link.tunnel is None:
            continue
        wanted = tunnel_segmentation_feature(link.tunnel.kind)
        underlay = snapshot.link_by_index(link.tunnel.underlay_index)
        tso = _feature(snapshot, name, "tx-tcp-segmentation")
        if wanted is None or underlay is None or tso is None or not tso.active:
            continue
        underlay_feature = _feature(snapshot, underlay.name, wanted)
        if underlay_feature is not None and underlay_feature.active:
            continue
        can_enable = underlay_feature is not None and not underlay_feature.fixed
        fix = feature_fix(underlay.name, wanted, True) if can_enable else None
        findings.append(
            Finding(
                id=f"tunnel-tso:{name}",
                severity=Severity.WARNING,
                subject=f"{name} over {underlay.name}",
                title=f"{name}: TSO on, but underlay {underlay.name} lacks {wanted}",
                evidence={
                    "tunnel": link.tunnel.kind,
                    "tunnel_tso": "on",
                    "underlay": underlay.name,
                    wanted: "off [fixed]" if underlay_feature and underlay_feature.fixed else "off",
                },
                explanation=(
                    f"{name} hands large TCP packets down as if the hardware would cut them, but "
                    f"{underlay.name} "
                    f"cannot segment {link.tunnel.kind}-encapsulated packets, so the kernel segments and "
                    "encapsulates every piece in software before the driver (seed 003; "
                    "segmentation-offloads.rst). "
                    + (
                        f"{underlay.name} can do it: turn {wanted} on."
                        if can_enable
                        else f"{underlay.name} cannot do it at all: expect the CPU cost, or use a NIC that "
                        f"offloads {link.tunnel.kind} ({wanted})."
                    )
                ),
                fix_commands=fix.commands if fix else (),
                persistent=fix.persistent if fix else (),
                actions=fix.actions if fix else (),
            )
        )
    return findings, "tunnel offload: every tunnel's underlay segments encapsulated TCP in hardware"


def check_checksum_note(window: Window) -> Verdict:
    """No finding: a line for the all-good list, because tcpdump's 'incorrect checksum' is a FAQ."""
    offloading = sorted(
        name
        for name, record in window.after.ethtool.items()
        if any(
            state.active
            for feature, state in record.features.items()
            if feature.startswith("tx-checksum") and feature != "tx-checksum-fcoe-crc"
        )
        and window.after.devices.get(name, None) is not None
        and window.after.devices[name].is_physical
    )
    if not offloading:
        return [], ""
    return [], (
        f"checksum offload: on for {', '.join(offloading)}; tcpdump on this host shows 'incorrect checksum' "
        f"for outgoing packets because the NIC fills the checksum in after capture. That is expected."
    )


def check_bond_slaves(window: Window) -> Verdict:
    snapshot = window.after
    findings: list[Finding] = []
    for bond_name, device in snapshot.devices.items():
        if not device.bond_slaves:
            continue
        bond_record = snapshot.ethtool.get(bond_name)
        if bond_record is None:
            continue
        differing: dict[str, dict[str, str]] = {}
        fixes = []
        for feature in BOND_COMPARED_FEATURES:
            states = {slave: _feature(snapshot, slave, feature) for slave in device.bond_slaves}
            known = {slave: state for slave, state in states.items() if state is not None}
            if len({state.active for state in known.values()}) < 2:
                continue
            bond_state = bond_record.features.get(feature)
            # Align the odd slaves to the bond's wanted state, or, lacking it, to "on" (the bond's default).
            wanted = bond_state.active if bond_state is not None else True
            differing[feature] = {slave: "on" if state.active else "off" for slave, state in known.items()}
            fixes += [
                feature_fix(slave, feature, wanted)
                for slave, state in known.items()
                if state.active != wanted and not state.fixed
            ]
        if not differing:
            continue
        fix = combine(*fixes)
        findings.append(
            Finding(
                id=f"bond-slave-offload:{bond_name}",
                severity=Severity.WARNING,
                subject=f"{bond_name} ({', '.join(device.bond_slaves)})",
                title=f"{bond_name}: slaves differ in {', '.join(sorted(differing))}",
                evidence={"bond_mode": device.bond_mode, "features": differing},
                explanation=(
                    f"The slaves of {bond_name} have different offload settings, so the bond can only offer "
                    "what "
                    "all of them share, and traffic behaves differently depending on which slave carries it "
                    "(a "
                    f"failover changes throughput). Set bond and slaves alike (seed 003: 'bond, eth0, eth1')."
                ),
                fix_commands=fix.commands,
                persistent=fix.persistent,
                actions=fix.actions,
            )
        )
    return findings, "bonds: slaves share the same offload settings"


RULES = [
    Rule("gro-off", check_gro_off),
    Rule("lro-forwarding", check_lro_forwarding),
    Rule("tunnel-tso", check_tunnel_segmentation),
    Rule("bond-slave-offload", check_bond_slaves),
    Rule("checksum-offload", check_checksum_note),
]
