"""Interfaces over rtnetlink (pyroute2 IPRoute): stats64, MTU, kind, master, veth peer, tunnel underlay.

Live reads happen when `root` is "/"; any other root is a recorded machine and the links come from
`<root>/netlink/links.json` (written by `netsleuth doctor --record`), so rules run on fixtures unchanged.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from netsleuth.doctor.model import LinkRecord, TunnelRecord, link_from_json

__all__ = ["LINKS_FILE", "is_live_root", "read_links"]

LINKS_FILE = "netlink/links.json"

# GRE flag bits carried in IFLA_GRE_OFLAGS (include/uapi/linux/if_tunnel.h); each adds a 4-byte word.
_GRE_OPTION_BITS = (0x8000, 0x2000, 0x1000)  # GRE_CSUM, GRE_KEY, GRE_SEQ
_TUNNEL_ATTRS = (
    "IFLA_VXLAN_LINK",
    "IFLA_VXLAN_GROUP6",
    "IFLA_VXLAN_LOCAL6",
    "IFLA_GENEVE_REMOTE6",
    "IFLA_GRE_LINK",
    "IFLA_GRE_OFLAGS",
    "IFLA_IPTUN_LINK",
)
# The far end of each tunnel kind, for finding the underlay by route when no lower device is configured.
_REMOTE_ATTRS = (
    "IFLA_VXLAN_GROUP",
    "IFLA_VXLAN_GROUP6",
    "IFLA_GENEVE_REMOTE",
    "IFLA_GENEVE_REMOTE6",
    "IFLA_GRE_REMOTE",
    "IFLA_IPTUN_REMOTE",
)


def is_live_root(root: Path) -> bool:
    return root.resolve() == Path("/")


def read_links(root: Path) -> dict[str, LinkRecord]:
    if not is_live_root(root):
        path = root / LINKS_FILE
        if not path.exists():
            return {}
        raw: list[dict[str, Any]] = json.loads(path.read_text())
        return {entry["name"]: link_from_json(entry) for entry in raw}
    return _read_live_links()


def _attr(message: Any, name: str) -> Any:
    return message.get_attr(name)


def _tunnel(kind: str | None, data: Any) -> TunnelRecord | None:
    if kind is None or data is None:
        return None
    attrs: dict[str, Any] = {}
    for name in _TUNNEL_ATTRS:
        value = data.get_attr(name)
        if value is not None:
            attrs[name] = value
    if kind == "vxlan":
        ipv6 = "IFLA_VXLAN_GROUP6" in attrs or "IFLA_VXLAN_LOCAL6" in attrs
        return TunnelRecord(kind=kind, underlay_index=attrs.get("IFLA_VXLAN_LINK") or None, ipv6=ipv6)
    if kind == "geneve":
        # Geneve has no lower-device attribute; the underlay is whatever routes to the remote.
        return TunnelRecord(kind=kind, underlay_index=None, ipv6="IFLA_GENEVE_REMOTE6" in attrs)
    if kind in ("gre", "gretap", "ip6gre", "ip6gretap", "erspan", "ip6erspan"):
        flags = attrs.get("IFLA_GRE_OFLAGS") or 0
        option_bytes = 4 * sum(1 for bit in _GRE_OPTION_BITS if flags & bit)
        return TunnelRecord(
            kind=kind,
            underlay_index=attrs.get("IFLA_GRE_LINK") or None,
            ipv6=kind.startswith("ip6"),
            option_bytes=option_bytes,
        )
    if kind in ("ipip", "sit", "ip6tnl"):
        return TunnelRecord(
            kind=kind, underlay_index=attrs.get("IFLA_IPTUN_LINK") or None, ipv6=kind == "ip6tnl"
        )
    return None


def _underlay_by_route(ipr: Any, data: Any) -> int | None:
    """The interface the kernel would send encapsulated packets out of: the route to the remote end."""
    for name in _REMOTE_ATTRS:
        remote = data.get_attr(name)
        if not remote or remote in ("0.0.0.0", "::") or str(remote).startswith(("224.", "ff")):
            continue
        try:
            routes = ipr.route("get", dst=remote)
        except Exception:  # no route: the tunnel cannot send at all, not our finding to make
            return None
        oif = routes[0].get_attr("RTA_OIF") if routes else None
        return int(oif) if oif else None
    return None


def _peer_in_other_netns(ipr: Any, peer_index: int, netnsid: int) -> tuple[str | None, int | None]:
    """Ask for a link in another namespace by its nsid (IFLA_IF_NETNSID, rtnetlink since 4.15).

    pyroute2's high-level `link("get")` drops the attribute, so the request is built by hand.
    """
    from pyroute2.netlink import NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_GETLINK
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    request = ifinfmsg()
    request["index"] = peer_index
    request["attrs"] = [("IFLA_IF_NETNSID", netnsid)]
    try:
        # pyroute2 0.9.7 IPRoute lacks this status key that nlm_request reads.
        ipr.status["nlm_generator"] = False
        reply = ipr.nlm_request(request, RTM_GETLINK, NLM_F_REQUEST)
        return _attr(reply[0], "IFLA_IFNAME"), _attr(reply[0], "IFLA_MTU")
    except Exception:  # the peer went away, or an old kernel: leave the peer unknown, never fail the run
        return None, None


def _netns_names_by_nsid(ipr: Any) -> dict[int, str]:
    """nsid (as this namespace numbers its peers, IFLA_LINK_NETNSID) -> `ip netns` name (or /proc/1/ns/net for
    the host's), by asking RTM_GETNSID for each namespace file (what `ip netns list-id` does); it never
    assigns an id."""
    import os

    names: dict[int, str] = {}
    for directory in ("/run/netns", "/var/run/netns"):
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in entries:
            try:
                fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                reply = ipr.get_netnsid(fd=fd)
            except Exception:  # a stale mount point, or not a namespace: it names nothing
                continue
            finally:
                os.close(fd)
            nsid = reply.get("nsid") if reply else None
            if isinstance(nsid, int) and nsid >= 0:
                names.setdefault(nsid, name)
    # The host's own namespace has no name; init's namespace file enters it (`nsenter --net=`).
    try:
        fd = os.open("/proc/1/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            reply = ipr.get_netnsid(fd=fd)
        finally:
            os.close(fd)
        nsid = reply.get("nsid") if reply else None
        if isinstance(nsid, int) and nsid >= 0:
            names.setdefault(nsid, "/proc/1/ns/net")
    except Exception:  # /proc hidden, or no nsid for it: the peer stays unnamed
        pass
    return names


def _read_live_links() -> dict[str, LinkRecord]:
    from pyroute2 import IPRoute

    links: dict[str, LinkRecord] = {}
    with IPRoute() as ipr:
        messages = list(ipr.get_links())
        by_index = {message["index"]: message for message in messages}
        netns_names: dict[int, str] | None = None
        for message in messages:
            name = _attr(message, "IFLA_IFNAME")
            info = _attr(message, "IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
            data = info.get_attr("IFLA_INFO_DATA") if info is not None else None
            link_index = _attr(message, "IFLA_LINK")
            netnsid = _attr(message, "IFLA_LINK_NETNSID")
            peer_name: str | None = None
            peer_mtu: int | None = None
            peer_netns: str | None = None
            if kind == "veth" and link_index:
                if netnsid is None and link_index in by_index:
                    peer = by_index[link_index]
                    peer_name, peer_mtu = _attr(peer, "IFLA_IFNAME"), _attr(peer, "IFLA_MTU")
                elif netnsid is not None:
                    peer_name, peer_mtu = _peer_in_other_netns(ipr, link_index, netnsid)
                    if netns_names is None:
                        netns_names = _netns_names_by_nsid(ipr)
                    peer_netns = netns_names.get(netnsid)
            tunnel = _tunnel(kind, data)
            if tunnel is not None and tunnel.underlay_index is None:
                tunnel = replace(tunnel, underlay_index=_underlay_by_route(ipr, data))
            stats = _attr(message, "IFLA_STATS64")
            links[name] = LinkRecord(
                index=message["index"],
                name=name,
                kind=kind,
                mtu=_attr(message, "IFLA_MTU"),
                operstate=_attr(message, "IFLA_OPERSTATE") or "UNKNOWN",
                master_index=_attr(message, "IFLA_MASTER"),
                link_index=link_index,
                link_netnsid=netnsid,
                peer_name=peer_name,
                peer_mtu=peer_mtu,
                peer_netns=peer_netns,
                tunnel=tunnel,
                num_rx_queues=_attr(message, "IFLA_NUM_RX_QUEUES") or 1,
                num_tx_queues=_attr(message, "IFLA_NUM_TX_QUEUES") or 1,
                stats={key: int(value) for key, value in dict(stats or {}).items()},
            )
    return links
