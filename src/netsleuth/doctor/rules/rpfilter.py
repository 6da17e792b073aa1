"""Reverse-path filtering drops (TcpExt.IPReversePathFilter, counted in ip_rcv_finish's fib_validate_source).

ip-sysctl.rst: rp_filter 1 (strict) drops a packet when the route back to its source does not leave through
the interface it arrived on; 2 (loose) only requires some route back. The effective value for an interface
is max(conf/all/rp_filter, conf/DEV/rp_filter), so both must change. Asymmetric routing, multi-homed hosts
and policy routing trip strict mode.
"""

from __future__ import annotations

from netsleuth.diagnostics.causes import cause
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import combine, sysctl_fix
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

MIN_DROPS = 3
LOOSE = 2


def check_rp_filter(window: Window) -> Verdict:
    drops = window.netstat_delta("TcpExt.IPReversePathFilter")
    if drops < MIN_DROPS:
        return [], "reverse-path filter: no packets dropped"
    strict = {
        key: value
        for key, value in window.after.sysctls.items()
        if key.startswith("net.ipv4.conf.")
        and key.endswith(".rp_filter")
        and value.strip() == "1"
        and ".default." not in key
    }
    fix = combine(*(sysctl_fix(key, LOOSE) for key in sorted(strict)))
    rate = window.per_second(drops)
    finding = Finding(
        id="rp-filter-drops",
        severity=Severity.WARNING,
        subject=", ".join(key.split(".")[3] for key in sorted(strict)) or "rp_filter",
        title=f"reverse-path filter drops {rate:.1f} packets/s",
        evidence={"IPReversePathFilter_per_s": round(rate, 1), "strict_rp_filter": sorted(strict)},
        explanation=cause("rp_filter").explain(),
        fix_commands=fix.commands,
        persistent=fix.persistent,
        actions=fix.actions,
        cause_code="rp_filter",
    )
    return [finding], ""


RULES = [Rule("rp-filter", check_rp_filter)]
