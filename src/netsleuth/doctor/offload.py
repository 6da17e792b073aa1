"""`netsleuth offload`: every feature of a device with its state and one line on what it does and when it
hurts; and setting one, on a bond also on its slaves.

Feature names are the kernel's (net/ethtool/common.c netdev_features_strings); `ethtool -K` short names
(gro, tso, lro, ...) are accepted as aliases and expand to the bits ethtool itself changes for them.
Descriptions follow Documentation/networking/netdev-features.rst, segmentation-offloads.rst and seed 003.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from netsleuth.doctor import ethtool, sysfs
from netsleuth.doctor.model import FeatureState
from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.netns_exec import call_in_netns

__all__ = ["ALIASES", "DESCRIPTIONS", "FeatureRow", "SetResult", "set_offload", "show_offloads"]

DESCRIPTIONS: dict[str, str] = {
    "rx-gro": "merges a flow's segments before the stack (GRO); off costs CPU per packet; safe to forward",
    "rx-lro": "NIC merges frames irreversibly (LRO); breaks forwarding/bridging, use GRO instead",
    "rx-gro-hw": "NIC does GRO itself (keeps boundaries); off only to work around firmware bugs",
    "rx-gro-list": "GRO keeps a list of original skbs (fraglist); helps UDP forwarding, costs for local TCP",
    "rx-udp-gro-forwarding": "GRO for forwarded UDP; helps UDP tunnel routers, can mis-size packets to apps",
    "tx-tcp-segmentation": "NIC cuts large TCP sends into MSS segments (TSO); off = CPU segments (GSO)",
    "tx-tcp6-segmentation": "TSO for IPv6; off = CPU segments IPv6 TCP",
    "tx-tcp-ecn-segmentation": "TSO for segments with ECN CWR set",
    "tx-tcp-mangleid-segmentation": "TSO that may rewrite IP IDs; off when a middlebox relies on IP ID order",
    "tx-tcp-accecn-segmentation": "TSO for segments using accurate ECN",
    "tx-generic-segmentation": "kernel segments right before the driver (GSO); off = segment early, more CPU",
    "tx-udp-segmentation": "NIC/kernel splits large UDP sends (UDP GSO); QUIC senders depend on it",
    "tx-gso-list": "GSO of fraglist skbs built by rx-gro-list",
    "tx-udp_tnl-segmentation": "NIC segments TCP inside VXLAN/Geneve; off = CPU segments every tunnel packet",
    "tx-udp_tnl-csum-segmentation": "as tx-udp_tnl-segmentation with outer UDP checksum",
    "tx-gre-segmentation": "NIC segments TCP inside GRE; off = CPU segments",
    "tx-gre-csum-segmentation": "as tx-gre-segmentation with GRE checksum",
    "tx-ipxip4-segmentation": "NIC segments TCP inside IPIP/SIT",
    "tx-ipxip6-segmentation": "NIC segments TCP inside IPv6 tunnels",
    "tx-gso-partial": "NIC segments the inner packet while the kernel fixes outer headers",
    "tx-sctp-segmentation": "segmentation of SCTP",
    "tx-esp-segmentation": "segmentation of IPsec ESP",
    "tx-fcoe-segmentation": "segmentation of FCoE",
    "tx-gso-robust": "GSO from untrusted sources (VM guests) is re-validated",
    "tx-tunnel-remcsum-segmentation": "segmentation with remote checksum offload",
    "tx-checksum-ipv4": "NIC fills TCP/UDP checksums (IPv4); tcpdump shows 'incorrect checksum' on TX",
    "tx-checksum-ipv6": "NIC fills TCP/UDP csum (IPv6); tcpdump shows 'incorrect checksum' on TX",
    "tx-checksum-ip-generic": "NIC fills any L4 checksum; buggy with some VXLAN setups (flannel#1282)",
    "tx-checksum-sctp": "NIC computes SCTP CRC32c",
    "tx-checksum-fcoe-crc": "NIC computes FCoE CRC",
    "rx-checksum": "NIC verifies RX checksums; off = CPU verifies every packet",
    "tx-scatter-gather": "NIC sends from scattered pages; TSO/GSO need it, off forces copies",
    "tx-scatter-gather-fraglist": "NIC sends skb frag lists directly",
    "rx-vlan-hw-parse": "NIC strips VLAN tags on RX (rxvlan); off only for captures needing the tag in place",
    "tx-vlan-hw-insert": "NIC inserts VLAN tags on TX (txvlan)",
    "rx-vlan-filter": "NIC drops frames of VLANs nobody configured",
    "rx-vlan-stag-hw-parse": "NIC strips 802.1ad S-tags",
    "tx-vlan-stag-hw-insert": "NIC inserts 802.1ad S-tags",
    "rx-vlan-stag-filter": "NIC filters 802.1ad S-tags",
    "rx-hashing": "NIC computes the flow hash (RSS) and hands it to the stack; saves a software hash",
    "rx-ntuple-filter": "NIC steers flows by rules (ethtool -N), needed for aRFS",
    "rx-fcs": "keep the Ethernet FCS on received frames (debugging)",
    "rx-all": "receive frames with bad CRC too (debugging); never in production",
    "highdma": "NIC can DMA to high memory",
    "loopback": "NIC loops TX back to RX (testing)",
    "tx-nocache-copy": "copy user data bypassing the cache on send; usually slower",
    "hw-tc-offload": "tc flower/matchall rules run in the NIC",
    "l2-fwd-offload": "NIC forwards between macvlans itself",
    "esp-hw-offload": "IPsec ESP crypto in the NIC",
    "esp-tx-csum-hw-offload": "checksum of ESP-encapsulated packets in the NIC",
    "rx-udp_tunnel-port-offload": "NIC parses VXLAN/Geneve on known UDP ports (needed for inner RSS/csum)",
    "tls-hw-tx-offload": "kTLS encryption in the NIC",
    "tls-hw-rx-offload": "kTLS decryption in the NIC",
    "tls-hw-record": "kTLS record handling in the NIC",
    "macsec-hw-offload": "MACsec in the NIC",
    "netns-local": "device cannot move to another network namespace",
    "vlan-challenged": "device cannot carry VLAN-sized frames",
    "fcoe-mtu": "device supports FCoE MTU",
    "rx-gro-hw-lro": "NIC merges receive traffic in hardware",
    "hsr-tag-ins-offload": "NIC inserts HSR/PRP redundancy tags",
    "hsr-tag-rm-offload": "NIC removes HSR/PRP redundancy tags",
    "hsr-fwd-offload": "NIC forwards HSR ring frames itself",
    "hsr-dup-offload": "NIC duplicates frames onto both HSR/PRP ports",
}

# `ethtool -K` short names -> kernel bits (ethtool's off_flag_def table, ethtool.c).
ALIASES: dict[str, tuple[str, ...]] = {
    "gro": ("rx-gro",),
    "lro": ("rx-lro",),
    "tso": (
        "tx-tcp-segmentation",
        "tx-tcp-ecn-segmentation",
        "tx-tcp-mangleid-segmentation",
        "tx-tcp6-segmentation",
    ),
    "gso": ("tx-generic-segmentation",),
    "sg": ("tx-scatter-gather", "tx-scatter-gather-fraglist"),
    "rx": ("rx-checksum",),
    "tx": (
        "tx-checksum-ipv4",
        "tx-checksum-ip-generic",
        "tx-checksum-ipv6",
        "tx-checksum-fcoe-crc",
        "tx-checksum-sctp",
    ),
    "rxvlan": ("rx-vlan-hw-parse",),
    "txvlan": ("tx-vlan-hw-insert",),
    "rxhash": ("rx-hashing",),
    "ntuple": ("rx-ntuple-filter",),
    "ufo": ("tx-udp-fragmentation",),
}


@dataclass(frozen=True)
class FeatureRow:
    name: str
    active: bool
    fixed: bool
    description: str


@dataclass(frozen=True)
class SetResult:
    device: str
    feature: str
    before: bool
    after: bool


def _features_of(device: str) -> dict[str, FeatureState]:
    records = ethtool.read_ethtool(Path("/"), [device])
    record = records.get(device)
    if record is None or not record.features:
        raise UsageError(f"no such device {device!r} (or it has no ethtool features)")
    return record.features


def _require_device(device: str) -> None:
    if device not in sysfs.list_devices(Path("/")):
        raise UsageError(f"no such device {device!r}")


def _show(devices: list[str] | None) -> dict[str, list[FeatureRow]]:
    names = devices if devices else [name for name in sysfs.list_devices(Path("/")) if name != "lo"]
    result: dict[str, list[FeatureRow]] = {}
    for name in names:
        _require_device(name)
        features = _features_of(name)
        result[name] = [
            FeatureRow(feature, state.active, state.fixed, DESCRIPTIONS.get(feature, ""))
            for feature, state in sorted(features.items())
        ]
    return result


def show_offloads(devices: list[str] | None = None, netns: str | None = None) -> dict[str, list[FeatureRow]]:
    return call_in_netns(netns, lambda: _show(devices))


def _resolve(feature: str, features: dict[str, FeatureState], device: str) -> list[str]:
    if feature in features:
        return [feature]
    if feature in ALIASES:
        present = [bit for bit in ALIASES[feature] if bit in features]
        if present:
            return present
    known = ", ".join(sorted(ALIASES))
    raise UsageError(f"{device} has no feature {feature!r} (kernel names as in `offload show`, or: {known})")


def _set(device: str, feature: str, enable: bool) -> list[SetResult]:
    _require_device(device)
    # Slaves first: the bond recomputes its own features from its slaves (bond_compute_features).
    targets = [*sysfs.read_device(Path("/"), device).bond_slaves, device]
    plan: list[tuple[str, list[str], dict[str, FeatureState]]] = []
    for target in targets:
        features = _features_of(target)
        bits = _resolve(feature, features, target)
        changeable = [bit for bit in bits if not features[bit].fixed]
        if not changeable:
            raise UsageError(
                f"{feature} is fixed on {target}: its driver does not allow changing it "
                f"(`ethtool -k {target}` shows [fixed])"
            )
        plan.append((target, changeable, features))
    results: list[SetResult] = []
    for target, bits, features in plan:
        try:
            after = ethtool.set_features(target, dict.fromkeys(bits, enable))
        except ethtool.EthtoolRefused as error:
            raise EnvironmentProblem(f"the driver refused: {error}") from error
        results += [SetResult(target, bit, features[bit].active, after[bit]) for bit in bits]
    return results


def set_offload(device: str, feature: str, enable: bool, netns: str | None = None) -> list[SetResult]:
    """Set `feature` on `device` (and on its slaves when it is a bond); refuse fixed features."""
    return call_in_netns(netns, lambda: _set(device, feature, enable))
