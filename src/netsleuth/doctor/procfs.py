"""Readers for /proc: softnet_stat, interrupts and IRQ affinity, softirqs, snmp/netstat, sysctls, conntrack.

Every reader takes `root` (the directory that holds `proc/`), so rules run on recorded fixtures exactly as on
the live machine. A file that does not exist (an older kernel, conntrack not loaded) reads as empty, never as
an error: absence is information the rules handle.
"""

from __future__ import annotations

import re
from pathlib import Path

from netsleuth.doctor.cpuset import parse_cpu_list
from netsleuth.doctor.model import ConntrackRecord, InterruptLine, IrqAffinity, SoftnetRow

__all__ = [
    "SYSCTLS",
    "parse_conntrack_stat",
    "parse_mib",
    "read_conntrack",
    "read_interrupts",
    "read_irq_affinity",
    "read_netstat",
    "read_softirqs",
    "read_softnet",
    "read_sysctls",
    "sysctl_path",
]

# The knobs the rules reason about (Documentation/admin-guide/sysctl/net.rst, networking/ip-sysctl.rst,
# networking/nf_conntrack-sysctl.rst). Per-device rp_filter entries are added by read_sysctls.
SYSCTLS = (
    "net.core.netdev_budget",
    "net.core.netdev_budget_usecs",
    "net.core.netdev_max_backlog",
    "net.core.rmem_default",
    "net.core.rmem_max",
    "net.core.wmem_default",
    "net.core.wmem_max",
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.udp_mem",
    "net.ipv4.ip_forward",
    "net.ipv6.conf.all.forwarding",
    "net.netfilter.nf_conntrack_tcp_be_liberal",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_count",
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_softnet(root: Path) -> tuple[SoftnetRow, ...]:
    """/proc/net/softnet_stat: one row per *online* CPU, hex columns.

    Columns (net/core/net-procfs.c): 0 processed, 1 dropped (backlog full), 2 time_squeeze, 3-8 unused,
    9 received_rps, 10 flow_limit_count, 11 backlog_len (5.10+), 12 CPU id (5.10+). Older kernels lack the
    CPU id, so the row number is used then, which is wrong only with offline CPUs (node_exporter#1625).
    """
    text = _read(root / "proc/net/softnet_stat")
    if text is None:
        return ()
    rows: list[SoftnetRow] = []
    for row_number, line in enumerate(text.splitlines()):
        columns = [int(column, 16) for column in line.split()]
        if len(columns) < 3:
            continue

        def column(index: int, cols: list[int] = columns) -> int:
            return cols[index] if len(cols) > index else 0

        rows.append(
            SoftnetRow(
                cpu=columns[12] if len(columns) > 12 else row_number,
                processed=columns[0],
                dropped=columns[1],
                time_squeeze=columns[2],
                received_rps=column(9),
                flow_limit_count=column(10),
                backlog_len=columns[11] if len(columns) > 11 else None,
            )
        )
    return tuple(rows)


def read_interrupts(root: Path) -> dict[int, InterruptLine]:
    """/proc/interrupts numbered lines: "  42:  10  20  PCI-MSIX-0000:00:03.0  1-edge  virtio2-input.0"."""
    text = _read(root / "proc/interrupts")
    if text is None:
        return {}
    lines = text.splitlines()
    if not lines:
        return {}
    cpu_count = len(lines[0].split())
    interrupts: dict[int, InterruptLine] = {}
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if not label.strip().isdigit():
            continue
        fields = rest.split()
        counts = [int(value) for value in fields[:cpu_count] if value.isdigit()]
        description = fields[len(counts) :]
        # The chip and hwirq/trigger come first; the handler names (comma-separated) are the tail.
        chip = description[0] if description else ""
        actions = " ".join(description[2:]) if len(description) > 2 else ""
        irq = int(label)
        interrupts[irq] = InterruptLine(irq=irq, per_cpu=tuple(counts), chip=chip, actions=actions)
    return interrupts


def read_irq_affinity(root: Path, irqs: list[int]) -> dict[int, IrqAffinity]:
    """/proc/irq/N/smp_affinity_list (requested) and effective_affinity_list (what the chip really does).

    They differ on x86 with many-CPU masks: the APIC delivers to one CPU of the mask (coreos/bugs#2135), so
    the effective list is what the pile-up rule judges.
    """
    affinity: dict[int, IrqAffinity] = {}
    for irq in irqs:
        requested_text = _read(root / f"proc/irq/{irq}/smp_affinity_list")
        if requested_text is None:
            continue
        requested = parse_cpu_list(requested_text)
        effective_text = _read(root / f"proc/irq/{irq}/effective_affinity_list")
        effective = parse_cpu_list(effective_text) if effective_text and effective_text.strip() else requested
        affinity[irq] = IrqAffinity(requested=requested, effective=effective)
    return affinity


def read_softirqs(root: Path) -> dict[str, tuple[int, ...]]:
    text = _read(root / "proc/softirqs")
    if text is None:
        return {}
    softirqs: dict[str, tuple[int, ...]] = {}
    for line in text.splitlines()[1:]:
        name, _, values = line.partition(":")
        if values:
            softirqs[name.strip()] = tuple(int(value) for value in values.split())
    return softirqs


def parse_mib(text: str) -> dict[str, int]:
    """/proc/net/snmp or /proc/net/netstat: pairs of lines, `TcpExt: Name Name...` then `TcpExt: 1 2...`,
    keyed like "TcpExt.ListenOverflows"."""
    counters: dict[str, int] = {}
    lines = text.splitlines()
    for header, values in zip(lines[::2], lines[1::2], strict=False):
        prefix, _, names = header.partition(":")
        _, _, numbers = values.partition(":")
        for field_name, number in zip(names.split(), numbers.split(), strict=False):
            try:
                counters[f"{prefix}.{field_name}"] = int(number)
            except ValueError:
                continue
    return counters


def read_netstat(root: Path) -> dict[str, int]:
    """/proc/net/snmp and /proc/net/netstat (header/value line pairs) and /proc/net/snmp6, keyed like
    "TcpExt.ListenOverflows" and "Udp6.RcvbufErrors"."""
    counters: dict[str, int] = {}
    for name in ("proc/net/snmp", "proc/net/netstat"):
        counters.update(parse_mib(_read(root / name) or ""))
    # IPv6 counters live in /proc/net/snmp6 as "Udp6RcvbufErrors  3" lines; key them like the others.
    text = _read(root / "proc/net/snmp6")
    for line in (text or "").splitlines():
        fields = line.split()
        match = _SNMP6_NAME.match(fields[0]) if len(fields) == 2 else None
        if match and fields[1].isdigit():
            counters[f"{match.group(1)}.{match.group(2)}"] = int(fields[1])
    return counters


_SNMP6_NAME = re.compile(r"^(Ip6|Icmp6|Udp6|UdpLite6)(\w+)$")


def _sysctl_path(root: Path, key: str) -> Path:
    return root / "proc/sys" / key.replace(".", "/")


def read_sysctls(root: Path, devices: list[str]) -> dict[str, str]:
    """The knobs in SYSCTLS plus rp_filter for all/default and each device (ip-sysctl.rst: the effective
    value is max(conf/all, conf/DEV))."""
    keys = list(SYSCTLS)
    keys += [f"net.ipv4.conf.{scope}.rp_filter" for scope in ("all", "default", *devices)]
    values: dict[str, str] = {}
    for key in keys:
        path = sysctl_path(root, key)
        text = _read(path)
        if text is not None:
            values[key] = " ".join(text.split())
    return values


def sysctl_path(root: Path, key: str) -> Path:
    """Where a sysctl lives under `root`, honouring device names with dots in net.ipv4.conf.*."""
    match = re.fullmatch(r"net\.ipv4\.conf\.(.+)\.(rp_filter|forwarding)", key)
    if match:
        return root / "proc/sys/net/ipv4/conf" / match.group(1) / match.group(2)
    return _sysctl_path(root, key)


def read_conntrack(root: Path) -> ConntrackRecord | None:
    """Entry count/max and the per-CPU event counters of /proc/net/stat/nf_conntrack (hex, summed)."""
    count_text = _read(root / "proc/sys/net/netfilter/nf_conntrack_count")
    max_text = _read(root / "proc/sys/net/netfilter/nf_conntrack_max")
    if count_text is None or max_text is None:
        return None
    stats = parse_conntrack_stat(_read(root / "proc/net/stat/nf_conntrack") or "")
    return ConntrackRecord(count=int(count_text.strip()), max=int(max_text.strip()), stats=stats)


def parse_conntrack_stat(text: str) -> dict[str, int]:
    """/proc/net/stat/nf_conntrack: a header line, then one line of hex counters per CPU, summed."""
    lines = text.splitlines()
    if not lines:
        return {}
    names = lines[0].split()
    stats: dict[str, int] = {}
    for line in lines[1:]:
        for name, value in zip(names, line.split(), strict=False):
            if name == "entries":  # a gauge repeated on every row, not a per-CPU counter
                stats[name] = int(value, 16)
                continue
            stats[name] = stats.get(name, 0) + int(value, 16)
    return stats
