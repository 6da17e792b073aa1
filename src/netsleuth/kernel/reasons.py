"""Drop-reason names of the running kernel, read at run time: never a table in our source.

`enum skb_drop_reason` was prepended to and reordered between kernels, and subsystems (6.4+) put their own
reasons in the high 16 bits (include/net/dropreason.h, SKB_DROP_REASON_SUBSYS_SHIFT), so a value means
nothing without the kernel it came from. Source: /sys/kernel/btf/vmlinux, or the skb:kfree_skb tracefs
format's __print_symbolic list when BTF lacks the enum.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from netsleuth.errors import EnvironmentProblem, UsageError, did_you_mean

__all__ = ["DropReasons", "load_drop_reasons"]

_PREFIX = "SKB_DROP_REASON_"
_SUBSYS_SHIFT = 16
# Subsystem enums (include/net/dropreason.h: mac80211, openvswitch...) are named <subsys>_drop_reason and
# their members carry a subsystem prefix; we read whichever of them the running kernel has.
_SUBSYS_ENUM = "skb_drop_reason_subsys"
_TRACEFS_FORMATS = (
    Path("/sys/kernel/tracing/events/skb/kfree_skb/format"),
    Path("/sys/kernel/debug/tracing/events/skb/kfree_skb/format"),
)


def _short(name: str) -> str:
    if name.startswith(_PREFIX):
        return name[len(_PREFIX) :]
    if name.startswith("SKB_"):
        return name[len("SKB_") :]
    return name


@dataclass(frozen=True)
class DropReasons:
    """value <-> short name (`NETFILTER_DROP`, `NO_SOCKET`, ...), as this kernel defines them."""

    by_value: dict[int, str]
    source: str

    @property
    def by_name(self) -> dict[str, int]:
        return {name: value for value, name in self.by_value.items()}

    def name(self, value: int) -> str:
        known = self.by_value.get(value)
        if known is not None:
            return known
        if value >> _SUBSYS_SHIFT:
            return f"SUBSYS_{value >> _SUBSYS_SHIFT}_{value & 0xFFFF}"
        return f"UNKNOWN_{value}"

    def value(self, name: str) -> int | None:
        return self.by_name.get(_short(name.upper()))

    def parse(self, names: Iterable[str]) -> set[int]:
        """Turn user-given names into values; an unknown name is a usage error that lists the valid ones."""
        values: set[int] = set()
        for name in names:
            value = self.value(name)
            if value is None or value in (self.consumed, self.not_dropped):
                not_drops = (self.consumed, self.not_dropped)
                valid = sorted(known for code, known in self.by_value.items() if code not in not_drops)
                raise UsageError(f"unknown drop reason {name!r}{did_you_mean(name, valid)}")
            values.add(value)
        return values

    @property
    def consumed(self) -> int | None:
        return self.value("CONSUMED")

    @property
    def not_dropped(self) -> int | None:
        return self.value("NOT_DROPPED_YET")


def _from_btf(btf_path: Path) -> DropReasons | None:
    from netsleuth.bpf.btf import VMLINUX_BTF, Btf, vmlinux_btf

    if not btf_path.exists():
        return None
    # The process-wide kernel BTF is borrowed, not closed; any other file is parsed and freed here.
    borrowed = btf_path == VMLINUX_BTF
    with contextlib.nullcontext(vmlinux_btf()) if borrowed else Btf.vmlinux(btf_path) as btf:
        members = btf.enum("skb_drop_reason")
        if not members:
            return None
        by_value = {value: _short(name) for name, value in members.items() if not name.endswith("_MAX")}
        subsystems = btf.enum(_SUBSYS_ENUM) or {}
        for subsys_name, subsys_id in subsystems.items():
            if subsys_id == 0 or subsys_name.endswith("_NUM"):
                continue
            # SKB_DROP_REASON_SUBSYS_MAC80211_UNUSABLE -> enum mac80211_drop_reason
            short = subsys_name.removeprefix("SKB_DROP_REASON_SUBSYS_").lower()
            for enum_name in (f"{short}_drop_reason", f"{short}_rx_drop_reason"):
                for name, value in (btf.enum(enum_name) or {}).items():
                    by_value[(subsys_id << _SUBSYS_SHIFT) | (value & 0xFFFF)] = name
        return DropReasons(by_value, f"BTF {btf_path}")


def _from_tracefs(paths: Iterable[Path]) -> DropReasons | None:
    for path in paths:
        try:
            text = path.read_text()
        except OSError:
            continue
        symbolic = text.partition("__print_symbolic")[2]
        pairs = re.findall(r"\{\s*(\d+)\s*,\s*\"([A-Z0-9_]+)\"\s*\}", symbolic)
        if pairs:
            return DropReasons({int(value): _short(name) for value, name in pairs}, f"tracefs {path}")
    return None


def load_drop_reasons(
    btf_path: Path = Path("/sys/kernel/btf/vmlinux"), tracefs_formats: Iterable[Path] = _TRACEFS_FORMATS
) -> DropReasons:
    reasons = _from_btf(btf_path) or _from_tracefs(tracefs_formats)
    if reasons is None:
        raise EnvironmentProblem(
            "this kernel does not name its drop reasons (no enum skb_drop_reason in BTF or tracefs); "
            "drop reasons need Linux 5.17 or newer"
        )
    return reasons
