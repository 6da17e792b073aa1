"""Builders for the three parts of every fix: the command to run now, the line that makes it persist, and
the `FixAction` --fix applies. One place, so a sysctl fix reads the same in every rule.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from netsleuth.doctor.findings import Finding, FixAction, FixKind
from netsleuth.netns_command import in_netns, is_host_wide_sysctl

__all__ = [
    "Fix",
    "action_netns",
    "apply_command",
    "channels_fix",
    "coalesce_fix",
    "combine",
    "feature_fix",
    "file_fix",
    "mtu_fix",
    "placed_in",
    "ring_fix",
    "sysctl_fix",
]

SYSCTL_FILE = "/etc/sysctl.d/90-netsleuth.conf"

# `ethtool -K` short names and systemd.link(5) keys for the features rules touch.
_FEATURE_SHORT = {
    "rx-gro": "gro",
    "rx-lro": "lro",
    "tx-tcp-segmentation": "tso",
    "tx-generic-segmentation": "gso",
    "tx-scatter-gather": "sg",
    "rx-checksum": "rx",
}
_FEATURE_LINK_KEY = {
    "rx-gro": "GenericReceiveOffload",
    "rx-lro": "LargeReceiveOffload",
    "tx-tcp-segmentation": "TCPSegmentationOffload",
    "tx-generic-segmentation": "GenericSegmentationOffload",
    "rx-checksum": "ReceiveChecksumOffload",
}
_CHANNEL_ARG = {"combined_count": "combined", "rx_count": "rx", "tx_count": "tx"}
_CHANNEL_LINK_KEY = {"combined_count": "CombinedChannels", "rx_count": "RxChannels", "tx_count": "TxChannels"}
_COALESCE_ARG = {"rx_coalesce_usecs": "rx-usecs", "use_adaptive_rx_coalesce": "adaptive-rx"}


@dataclass(frozen=True)
class Fix:
    commands: tuple[str, ...] = ()
    persistent: tuple[str, ...] = ()
    actions: tuple[FixAction, ...] = ()


def combine(*fixes: Fix) -> Fix:
    return Fix(
        commands=tuple(command for fix in fixes for command in fix.commands),
        persistent=tuple(line for fix in fixes for line in fix.persistent),
        actions=tuple(action for fix in fixes for action in fix.actions),
    )


def _link_file(device: str, key: str, value: str) -> str:
    return (
        f"/etc/systemd/network/10-netsleuth-{device}.link: [Match] OriginalName={device} [Link] {key}={value}"
    )


def sysctl_fix(key: str, value: int | str) -> Fix:
    return Fix(
        commands=(f"sysctl -w {key}='{value}'" if " " in str(value) else f"sysctl -w {key}={value}",),
        persistent=(f"{SYSCTL_FILE}: {key} = {value}",),
        actions=(FixAction(FixKind.SYSCTL, key, str(value)),),
    )


def feature_fix(device: str, feature: str, enable: bool) -> Fix:
    state = "on" if enable else "off"
    short = _FEATURE_SHORT.get(feature, feature)
    link_key = _FEATURE_LINK_KEY.get(feature)
    persistent = (_link_file(device, link_key, "true" if enable else "false"),) if link_key else ()
    return Fix(
        commands=(f"ethtool -K {device} {short} {state}",),
        persistent=persistent or (f"run `ethtool -K {device} {short} {state}` where {device} is set up",),
        actions=(FixAction(FixKind.FEATURE, device, state, setting=feature),),
    )


def ring_fix(device: str, rx: int) -> Fix:
    return Fix(
        commands=(f"ethtool -G {device} rx {rx}",),
        persistent=(_link_file(device, "RxBufferSize", str(rx)),),
        actions=(FixAction(FixKind.RING, device, str(rx), setting="rx"),),
    )


def channels_fix(device: str, setting: str, count: int) -> Fix:
    return Fix(
        commands=(f"ethtool -L {device} {_CHANNEL_ARG[setting]} {count}",),
        persistent=(_link_file(device, _CHANNEL_LINK_KEY[setting], str(count)),),
        actions=(FixAction(FixKind.CHANNELS, device, str(count), setting=setting),),
    )


def coalesce_fix(device: str, setting: str, value: int) -> Fix:
    argument = _COALESCE_ARG[setting]
    shown = ("on" if value else "off") if setting.startswith("use_adaptive") else str(value)
    link_value = ("true" if value else "false") if setting.startswith("use_adaptive") else f"{value}us"
    link_key = "UseAdaptiveRxCoalesce" if setting.startswith("use_adaptive") else "RxCoalesceSec"
    return Fix(
        commands=(f"ethtool -C {device} {argument} {shown}",),
        persistent=(_link_file(device, link_key, link_value),),
        actions=(FixAction(FixKind.COALESCE, device, str(value), setting=setting),),
    )


def file_fix(path: str, value: str, persistent: str) -> Fix:
    return Fix(
        commands=(f"echo {value} > {path}",),
        persistent=(persistent,),
        actions=(FixAction(FixKind.FILE, path, value),),
    )


def mtu_fix(device: str, mtu: int) -> Fix:
    return Fix(
        commands=(f"ip link set dev {device} mtu {mtu}",),
        persistent=(
            f"set MTU {mtu} where {device} is created (systemd-networkd MTUBytes=, CNI/netplan mtu)",
        ),
        actions=(FixAction(FixKind.MTU, device, str(mtu)),),
    )


def apply_command(finding_id: str, netns: str | None) -> str:
    """The `--fix` line for a finding, with the namespace it was found in: without `--netns`, doctor
    measures the host's namespace, which has no such finding."""
    where = f" --netns {shlex.quote(netns)}" if netns else ""
    return f"netsleuth doctor{where} --fix {shlex.quote(finding_id)} --yes"


def action_netns(actions: tuple[FixAction, ...], netns: str | None) -> str | None:
    """Where --fix must make these changes: the host's namespace when they are all host-wide sysctls (read
    only inside a namespace, see netns_command.HOST_WIDE_SYSCTLS), else the finding's namespace."""
    if actions and all(a.kind is FixKind.SYSCTL and is_host_wide_sysctl(a.target) for a in actions):
        return None
    return netns


def _persistent_in(line: str, netns: str) -> str:
    # /etc/sysctl.d is applied to the host's namespace at boot; a namespace gets its values from whatever
    # creates it.
    if not line.startswith(f"{SYSCTL_FILE}: "):
        return line
    key, _, value = line[len(SYSCTL_FILE) + 2 :].partition(" = ")
    if is_host_wide_sysctl(key):
        return line
    command = in_netns(f"sysctl -w {key}={shlex.quote(value)}", netns)
    return f"run `{command}` wherever netns {netns} is created ({SYSCTL_FILE} sets the host's namespace only)"


def placed_in(finding: Finding, netns: str | None) -> Finding:
    """The finding as printed for `netns`: every fix command and the apply line carry the namespace."""
    return dataclasses.replace(
        finding,
        fix_commands=tuple(in_netns(command, netns) for command in finding.fix_commands),
        persistent=tuple(_persistent_in(line, netns) for line in finding.persistent)
        if netns
        else finding.persistent,
        apply_command=apply_command(finding.id, netns) if finding.actions else "",
    )
