"""RX ring exhaustion: the NIC had a packet and no free descriptor to put it in.

if_link.h (struct rtnl_link_stats64) puts that loss in rx_missed_errors; drivers also keep their own names
for it (`ethtool -S`): igb/ixgbe rx_no_buffer_count, mlx5 rx_out_of_buffer, veth/virtio rx_queue_N_drops.
rx_fifo_errors is only "historically the count of overflow events" (if_link.h) and is read as a hint.
"""

from __future__ import annotations

import re

from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import ring_fix
from netsleuth.doctor.model import EthtoolRecord
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

# Driver counters that mean "no RX buffer/descriptor available" (see module docstring).
NO_BUFFER_COUNTER = re.compile(
    r"^(rx_no_buffer_count|rx_out_of_buffer|rx_missed_errors|rx_no_bufs?|rx_nobuf|rx_no_desc"
    r"|rx_discards_phy|rx_queue_\d+_drops|rx\d*_no_buff?(er)?_count|.*no_buf.*)$"
)
# A single miss in a short window is noise; a handful means the ring really ran dry.
MIN_MISSED = 5
# netutils-linux rx_buffers.py prefers 2048 when the max allows; doubling is the RHEL guide's step.
PREFERRED_RX_RING = 2048


def _suggested_ring(current: int, maximum: int) -> int:
    return min(maximum, max(current * 2, PREFERRED_RX_RING))


def check_ring_exhaustion(window: Window) -> Verdict:
    findings: list[Finding] = []
    for name in window.after.links:
        record = window.after.ethtool.get(name, EthtoolRecord())
        missed = window.link_delta(name, "rx_missed_errors")
        fifo = window.link_delta(name, "rx_fifo_errors")
        driver_counters = {
            stat: delta
            for stat in record.driver_stats
            if NO_BUFFER_COUNTER.match(stat) and (delta := window.driver_stat_delta(name, stat)) > 0
        }
        lost = max(missed, sum(driver_counters.values()))
        if lost < MIN_MISSED:
            continue
        rings = record.rings
        evidence: dict[str, object] = {
            "rx_missed_errors_per_s": round(window.per_second(missed), 1),
            "rx_fifo_errors_per_s": round(window.per_second(fifo), 1),
            "rx_packets_per_s": round(window.link_rate(name, "rx_packets"), 1),
        }
        evidence.update(
            {f"{stat}_per_s": round(window.per_second(delta), 1) for stat, delta in driver_counters.items()}
        )
        fix = None
        if rings is not None and rings.rx is not None and rings.rx_max is not None:
            evidence.update({"rx_ring": rings.rx, "rx_ring_max": rings.rx_max})
            if rings.rx < rings.rx_max:
                target = _suggested_ring(rings.rx, rings.rx_max)
                fix = ring_fix(name, target)
                explanation = (
                    f"{name} dropped packets because its RX ring was full: the NIC had nowhere to put them. "
                    f"The ring holds {rings.rx} descriptors of a possible {rings.rx_max}; a bigger ring "
                    "absorbs "
                    "bursts while the CPU catches up. Many drivers reset the link to resize it (a short "
                    "outage)."
                )
            else:
                explanation = (
                    f"{name} dropped packets because its RX ring was full, and the ring is already at its "
                    "maximum "
                    f"({rings.rx_max}). The CPU that drains it is too slow or too busy: spread the queue "
                    "IRQs, "
                    f"add queues (ethtool -L) or reduce per-packet work; see the IRQ and softnet findings."
                )
        else:
            explanation = (
                f"{name} dropped packets for lack of RX buffers; the driver does not report its ring size, "
                "so "
                f"look at the CPU that serves its interrupts."
            )
        findings.append(
            Finding(
                id=f"ring-exhaustion:{name}",
                severity=Severity.CRITICAL,
                subject=name,
                title=f"{name}: RX ring overflowing ({window.per_second(lost):.1f} packets/s lost)",
                evidence=evidence,
                explanation=explanation,
                fix_commands=fix.commands if fix else (),
                persistent=fix.persistent if fix else (),
                actions=fix.actions if fix else (),
            )
        )
    return findings, "RX rings: no device missed packets for lack of ring buffers"


RULES = [Rule("ring-exhaustion", check_ring_exhaustion)]
