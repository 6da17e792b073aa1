"""CPU list and CPU mask notation, both ways: "0-3,8" (smp_affinity_list) and "0000010f" (rps_cpus).

Formats from Documentation/admin-guide/cputopology.rst (lists) and Documentation/networking/scaling.rst
(comma-separated 32-bit hex words, most significant first, for rps_cpus/xps_cpus).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_cpu_list", "format_cpu_mask", "parse_cpu_list", "parse_cpu_mask"]


def parse_cpu_list(text: str) -> tuple[int, ...]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            first, last = part.split("-", 1)
            cpus.extend(range(int(first), int(last) + 1))
        else:
            cpus.append(int(part))
    return tuple(sorted(set(cpus)))


def format_cpu_list(cpus: Iterable[int]) -> str:
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = index
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        first, last = ordered[start], ordered[index]
        ranges.append(str(first) if first == last else f"{first}-{last}")
        index += 1
    return ",".join(ranges)


def parse_cpu_mask(text: str) -> tuple[int, ...]:
    value = int(text.strip().replace(",", "") or "0", 16)
    return tuple(bit for bit in range(value.bit_length()) if value >> bit & 1)


def format_cpu_mask(cpus: Iterable[int]) -> str:
    value = 0
    for cpu in cpus:
        value |= 1 << cpu
    return format(value, "x")
