"""Interface drop and error ratios, judged per million packets with a minimum-traffic gate, and the
rx_dropped pitfall.

rx_dropped is not "the NIC ran out of room" (that is rx_missed_errors, rules/ring.py). Before Linux 4.6 it
also counted frames no protocol handler wanted (unknown EtherType, VLAN tags with no VLAN device, LLDP);
commit 6e7333d315a7 moved those to rx_nohandler. Bonding still counts frames arriving on inactive slaves
as rx_dropped. netdata#4536/#5158 are users chasing exactly these.
"""

from __future__ import annotations

from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_PACKETS = 200  # below this many packets in the window a ratio says nothing
WARN_PPM = 1_000  # 0.1 %
CRITICAL_PPM = 10_000  # 1 %; node-mixin NodeNetworkReceiveErrs fires at 1 % of packets
MIN_NOHANDLER_PER_S = 1.0
_ERROR_DETAIL = (
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_length_errors",
    "rx_over_errors",
    "tx_carrier_errors",
)


def _ppm(part: int, whole: int) -> float:
    return part * 1e6 / whole if whole else 0.0


def _severity(ppm: float) -> Severity:
    return Severity.CRITICAL if ppm >= CRITICAL_PPM else Severity.WARNING


def _is_bond_slave(window: Window, name: str) -> bool:
    link = window.after.links[name]
    master = window.after.link_by_index(link.master_index)
    return master is not None and master.kind == "bond"


def check_drop_ratio(window: Window) -> Verdict:
    findings: list[Finding] = []
    for name in window.after.links:
        for direction in ("rx", "tx"):
            dropped = window.link_delta(name, f"{direction}_dropped")
            packets = window.link_delta(name, f"{direction}_packets")
            total = packets + dropped
            if total < MIN_PACKETS or dropped == 0:
                continue
            ppm = _ppm(dropped, total)
            if ppm < WARN_PPM:
                continue
            evidence: dict[str, object] = {
                f"{direction}_dropped_per_s": round(window.per_second(dropped), 1),
                f"{direction}_packets_per_s": round(window.per_second(packets), 1),
                "dropped_per_million": round(ppm),
            }
            severity = _severity(ppm)
            if direction == "rx" and _is_bond_slave(window, name):
                severity = Severity.INFO
                explanation = (
                    f"{name} is a bond slave: the bonding driver counts frames that arrive on an inactive "
                    "slave "
                    "as rx_dropped (Documentation/networking/bonding.rst). That is expected, not lost "
                    "traffic."
                )
            elif direction == "rx":
                explanation = (
                    f"{name} drops {ppm / 1e4:.2f} % of received packets in the kernel after the NIC "
                    "delivered "
                    f"them (rx_dropped). Typical causes: a full per-CPU backlog (see the softnet findings), "
                    "frames for a protocol or VLAN nothing listens to on older kernels/drivers, or a "
                    "qdisc/XDP "
                    f"drop. It is not a ring overflow (that is rx_missed_errors). "
                    f"`netsleuth drops` shows the kernel's drop reason for each packet."
                )
            else:
                explanation = (
                    f"{name} drops {ppm / 1e4:.2f} % of packets it is asked to send (tx_dropped): the qdisc "
                    "or "
                    "driver queue is full, or the device (a veth peer, a tunnel without route) cannot "
                    "deliver. "
                    f"`netsleuth drops` shows the kernel's drop reason."
                )
            findings.append(
                Finding(
                    id=f"{direction}-drops:{name}",
                    severity=severity,
                    subject=name,
                    title=f"{name}: {ppm / 1e4:.2f} % of {direction.upper()} packets dropped",
                    evidence=evidence,
                    explanation=explanation,
                )
            )
    return findings, "interface drops: below 0.1 % of packets on every device with traffic"


def check_errors(window: Window) -> Verdict:
    findings: list[Finding] = []
    for name in window.after.links:
        for direction in ("rx", "tx"):
            errors = window.link_delta(name, f"{direction}_errors")
            packets = window.link_delta(name, f"{direction}_packets")
            if errors == 0 or packets + errors < MIN_PACKETS:
                continue
            ppm = _ppm(errors, packets + errors)
            if ppm < WARN_PPM:
                continue
            detail = {
                f"{stat}_per_s": round(window.link_rate(name, stat), 1)
                for stat in _ERROR_DETAIL
                if stat.startswith(direction) and window.link_delta(name, stat) > 0
            }
            findings.append(
                Finding(
                    id=f"{direction}-errors:{name}",
                    severity=_severity(ppm),
                    subject=name,
                    title=f"{name}: {ppm / 1e4:.2f} % of {direction.upper()} packets with errors",
                    evidence={"errors_per_million": round(ppm), **detail},
                    explanation=(
                        f"{name} sees damaged or refused frames. CRC/frame/length errors point at the "
                        "physical "
                        "layer (cable, transceiver, a duplex or speed mismatch with the switch port); "
                        "carrier "
                        f"errors at a flapping link. No setting on this host fixes that: check the port's "
                        f"counters on the switch side too."
                    ),
                )
            )
    return findings, "interface errors: none rising"


def check_nohandler(window: Window) -> Verdict:
    findings: list[Finding] = []
    for name in window.after.devices:
        rate = window.per_second(window.extra_stat_delta(name, "rx_nohandler"))
        if rate < MIN_NOHANDLER_PER_S:
            continue
        findings.append(
            Finding(
                id=f"rx-nohandler:{name}",
                severity=Severity.INFO,
                subject=name,
                title=f"{name}: {rate:.1f} frames/s for protocols nothing listens to",
                evidence={"rx_nohandler_per_s": round(rate, 1)},
                explanation=(
                    f"{name} receives frames with an EtherType or VLAN tag that no protocol handler on this "
                    "host "
                    f"takes (LLDP, tagged VLANs without a VLAN device, IPX, ...). The kernel counts them in "
                    f"rx_nohandler (older kernels: rx_dropped). They cost nothing but a counter; they are "
                    f"why a raw drop count can look alarming while no real traffic is lost."
                ),
            )
        )
    return findings, ""


RULES = [Rule("drops", check_drop_ratio), Rule("errors", check_errors), Rule("nohandler", check_nohandler)]
