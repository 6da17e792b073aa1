"""ethtool state of each device: driver info, features, rings, channels, coalescing, driver counters.

What pyroute2 0.9 provides is used as is: `pyroute2.ethtool.Ethtool` reads rings over ethtool genetlink
(ETHTOOL_MSG_RINGS_GET, falling back to the ioctl) and features, channels and coalescing through the
SIOCETHTOOL ioctl (ETHTOOL_GFEATURES, GCHANNELS, GCOALESCE); `IoctlEthtool.get_statistics` gives the
`ethtool -S` counters (ETHTOOL_GSSET_INFO/GSTRINGS/GSTATS). Driver info (ETHTOOL_GDRVINFO) has no pyroute2
call and no netlink message, so it is one ioctl here (include/uapi/linux/ethtool.h `struct ethtool_drvinfo`).
Nothing parses ethtool's text output (the tuned#726 class of bug).

A recorded machine (`root` other than "/") reads `<root>/netlink/ethtool.json` instead.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import socket
import struct
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from netsleuth.doctor.links import is_live_root
from netsleuth.doctor.model import ChannelRecord, EthtoolRecord, FeatureState, RingRecord, ethtool_from_json

__all__ = [
    "ETHTOOL_FILE",
    "EthtoolRefused",
    "read_ethtool",
    "set_channels",
    "set_coalesce",
    "set_features",
    "set_rings",
]

ETHTOOL_FILE = "netlink/ethtool.json"

_SIOCETHTOOL = 0x8946  # include/uapi/linux/sockios.h
_ETHTOOL_GDRVINFO = 0x00000003
_DRVINFO_SIZE = 196  # cmd + 5 x char[32] + reserved2[12] + 5 x u32


class EthtoolRefused(Exception):
    """The driver refused or does not support a change."""


def read_ethtool(
    root: Path, names: Iterable[str], settings_from: dict[str, EthtoolRecord] | None = None
) -> dict[str, EthtoolRecord]:
    """Every device's ethtool state. With `settings_from` (an earlier read of the same run) only the driver
    counters are read again: settings do not change between two samples, counters do."""
    if not is_live_root(root):
        path = root / ETHTOOL_FILE
        if not path.exists():
            return {}
        raw: dict[str, Any] = json.loads(path.read_text())
        return {name: ethtool_from_json(value) for name, value in raw.items()}
    from pyroute2.ethtool import Ethtool

    records: dict[str, EthtoolRecord] = {}
    with Ethtool() as ethtool, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as ioctl_socket:
        for name in names:
            if name == "lo":
                continue
            earlier = settings_from.get(name) if settings_from is not None else None
            if earlier is not None:
                records[name] = replace(earlier, driver_stats=_driver_stats(name))
            else:
                records[name] = _read_one(ethtool, ioctl_socket, name)
    return records


def _drvinfo(ioctl_socket: socket.socket, name: str) -> tuple[str | None, str | None, str | None]:
    buffer = ctypes.create_string_buffer(struct.pack("I", _ETHTOOL_GDRVINFO), _DRVINFO_SIZE)
    request = struct.pack("16sP", name.encode()[:15], ctypes.addressof(buffer))
    try:
        fcntl.ioctl(ioctl_socket.fileno(), _SIOCETHTOOL, request)
    except OSError:
        return None, None, None
    fields = [buffer.raw[4 + 32 * i : 4 + 32 * (i + 1)].split(b"\0", 1)[0].decode() for i in range(4)]
    driver, _version, firmware, bus_info = fields
    return driver or None, bus_info or None, firmware or None


def _quietly(call: Any, *args: Any) -> Any:
    # Each ethtool group is optional: veth has no coalescing, many virtual devices no rings.
    try:
        return call(*args)
    except Exception:
        return None


def _read_one(ethtool: Any, ioctl_socket: socket.socket, name: str) -> EthtoolRecord:
    driver, bus_info, firmware = _drvinfo(ioctl_socket, name)
    features: dict[str, FeatureState] = {}
    raw_features = _quietly(ethtool.get_features, name)
    if raw_features is not None:
        for feature in raw_features.features.values():
            if feature.name:
                # ethtool prints "[fixed]" for bits outside hw_features: `available` is that mask.
                features[feature.name] = FeatureState(
                    active=bool(feature.enable), fixed=not feature.available
                )
    rings = None
    # The ioctl (ETHTOOL_GRINGPARAM) rather than pyroute2's netlink path, which binds the genetlink family
    # on every call (~2 ms per device, most of a 200-device snapshot); the values are the same.
    raw_rings = _quietly(ethtool.get_rings, name, False)
    if raw_rings is not None and (raw_rings.rx_max or raw_rings.tx_max):
        rings = RingRecord(rx=raw_rings.rx, rx_max=raw_rings.rx_max, tx=raw_rings.tx, tx_max=raw_rings.tx_max)
    channels = None
    raw_channels = _quietly(ethtool.get_channels, name)
    if raw_channels is not None:
        channels = ChannelRecord(
            rx=raw_channels.rx_count,
            tx=raw_channels.tx_count,
            other=raw_channels.other_count,
            combined=raw_channels.combined_count,
            max_rx=raw_channels.max_rx,
            max_tx=raw_channels.max_tx,
            max_other=raw_channels.max_other,
            max_combined=raw_channels.max_combined,
        )
    coalesce = _quietly(ethtool.get_coalesce, name)
    if coalesce is not None:
        coalesce = {key: int(value) for key, value in coalesce.items() if key != "cmd"}
    return EthtoolRecord(
        driver=driver,
        bus_info=bus_info,
        firmware_version=firmware,
        features=features,
        rings=rings,
        channels=channels,
        coalesce=coalesce,
        driver_stats=_driver_stats(name),
    )


def _driver_stats(name: str) -> dict[str, int]:
    from pyroute2.ethtool.ioctl import IoctlEthtool

    try:
        ioctl = IoctlEthtool(name)
    except Exception:
        return {}
    try:
        return {str(stat): int(value) for stat, value in ioctl.get_statistics()}
    except Exception:
        return {}
    finally:
        ioctl.close()


def set_features(name: str, wanted: dict[str, bool]) -> dict[str, bool]:
    """Set kernel feature bits (netdev_features_strings names); return the active state afterwards.

    The kernel may silently keep a bit off when a dependency is missing (tso needs sg), so the caller
    compares what it asked with what it got.
    """
    from pyroute2.ethtool import Ethtool

    with Ethtool() as ethtool:
        try:
            features = ethtool.get_features(name)
            for feature_name, enable in wanted.items():
                features.features[feature_name].enable = enable
            ethtool.set_features(name, features)
            after = ethtool.get_features(name)
        except Exception as error:
            raise EthtoolRefused(f"{name}: {error}") from error
        return {feature_name: bool(after.features[feature_name].enable) for feature_name in wanted}


def set_rings(name: str, rx: int | None = None, tx: int | None = None) -> None:
    """`ethtool -G`: many drivers reset the link to resize rings, so the caller warns first."""
    from pyroute2.ethtool import Ethtool

    values = {key: value for key, value in (("rx", rx), ("tx", tx)) if value is not None}
    with Ethtool() as ethtool:
        try:
            ethtool.set_rings(name, **values)
        except Exception as error:
            raise EthtoolRefused(f"{name}: {error}") from error


def set_channels(name: str, counts: dict[str, int]) -> None:
    """`ethtool -L`; keys are pyroute2's ("combined_count", "rx_count", ...)."""
    from pyroute2.ethtool import Ethtool

    with Ethtool() as ethtool:
        try:
            ethtool.set_channels(name, counts)
        except Exception as error:
            raise EthtoolRefused(f"{name}: {error}") from error


def set_coalesce(name: str, values: dict[str, int]) -> None:
    """`ethtool -C`; keys are struct ethtool_coalesce field names ("rx_coalesce_usecs", ...)."""
    from pyroute2.ethtool import Ethtool

    with Ethtool() as ethtool:
        try:
            ethtool.set_coalesce(name, values)
        except Exception as error:
            raise EthtoolRefused(f"{name}: {error}") from error
