"""The conntrack entries a fleet session ends with: what lets the controller follow a flow across NAT.

At a session's end the agent reads the conntrack table of the namespace it traced (over ctnetlink,
kernel/conntrack.py) and sends the entries that belong to the session's flows as `conntrack` records
(nat_join.ConntrackEntry.to_record, the format the controller's merge reads). An entry belongs when either
of its directions matches the session's filters as a packet would: the original tuple as the client sent
it, or the reply tuple turned around - the same flow after the NAT - so a DNATed flow filtered on
`dport 80` (before the NAT) or on `dport 8080` (after it) is found either way.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple
from netsleuth.kernel.conntrack import ConntrackReader

__all__ = ["CONNTRACK_DIAGNOSTICS", "MAX_CONNTRACK_RECORDS", "conntrack_records", "entry_matches"]

CONNTRACK_DIAGNOSTICS = frozenset({"conn", "drops", "resets", "diagnose"})  # the flow diagnostics
MAX_CONNTRACK_RECORDS = 512  # per host and session (FLEET-CONTRACT.md)
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(value: object) -> list[_Network]:
    items = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(str(item), strict=False))
        except ValueError:
            continue  # the diagnostic's own validation has refused it already
    return networks


def _in(address: str, networks: Sequence[_Network]) -> bool:
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(parsed in network for network in networks)


def _port(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _direction_matches(flow: FlowTuple, config: Mapping[str, Any]) -> bool:
    proto = config.get("proto")
    if isinstance(proto, str) and proto not in ("any", "all") and flow.proto != proto:
        return False
    (src_addr, src_port), (dst_addr, dst_port) = flow.src, flow.dst
    checks = (
        ("dport", lambda port: dst_port == port),
        ("sport", lambda port: src_port == port),
        ("port", lambda port: port in (src_port, dst_port)),
    )
    for key, check in checks:
        wanted = _port(config.get(key))
        if wanted is not None and not check(wanted):
            return False
    address_checks: tuple[tuple[str, Callable[[list[_Network]], bool]], ...] = (
        ("host", lambda nets: _in(src_addr, nets) or _in(dst_addr, nets)),
        ("src", lambda nets: _in(src_addr, nets)),
        ("dst", lambda nets: _in(dst_addr, nets)),
    )
    for key, address_check in address_checks:
        networks = _networks(config.get(key))
        if networks and not address_check(networks):
            return False
    return True


def entry_matches(entry: ConntrackEntry, config: Mapping[str, Any]) -> bool:
    return _direction_matches(entry.original, config) or _direction_matches(entry.translated, config)


def conntrack_records(
    config: Mapping[str, Any],
    netns: str,
    label: str,
    reader_factory: Callable[[Sequence[str]], ConntrackReader] = lambda spaces: ConntrackReader(
        proto=None, namespaces=spaces
    ),
) -> tuple[list[dict[str, Any]], str | None]:
    """(records, a note if entries were cut or unreadable). `netns` is a name or a /proc path to read;
    `label` the namespace name the records carry."""
    reader = reader_factory([netns])
    try:
        entries = [entry for entry in reader.entries() if entry_matches(entry, config)]
        problems = list(reader.problems.values())
    finally:
        reader.close()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    records = [entry.to_record(label, now) for entry in entries[:MAX_CONNTRACK_RECORDS]]
    notes = []
    if len(entries) > MAX_CONNTRACK_RECORDS:
        notes.append(
            f"{len(entries) - MAX_CONNTRACK_RECORDS} conntrack entries beyond {MAX_CONNTRACK_RECORDS} cut"
        )
    notes.extend(problems)
    return records, "; ".join(notes) or None
