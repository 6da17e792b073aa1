"""Connection tracking: a full table drops new flows; a rising `invalid` count is packets conntrack could
not place in a flow (Documentation/networking/nf_conntrack-sysctl.rst).

Seed 001 is the classic: an out-of-window TCP packet is marked INVALID, skips the NAT table, reaches a
LISTEN socket un-NATed and draws a RST. nf_conntrack_tcp_be_liberal = 1 makes conntrack accept
out-of-window packets instead (a trade-off: it also stops marking genuinely bogus segments invalid).
"""

from __future__ import annotations

from netsleuth.diagnostics.causes import cause
from netsleuth.doctor.findings import Finding, Severity
from netsleuth.doctor.fixes import sysctl_fix
from netsleuth.doctor.rules.rule import Rule, Verdict
from netsleuth.doctor.window import Window

__all__ = ["RULES"]

# netdata netfilter.conf: warn 90 %, crit 95 %; node-mixin warns at 75 %.
WARN_FILL = 0.75
CRITICAL_FILL = 0.90
MIN_INVALID_PER_S = 1.0


def check_conntrack_fill(window: Window) -> Verdict:
    record = window.after.conntrack
    if record is None or record.max <= 0:
        return [], ""
    before = window.before.conntrack
    dropped = 0
    if before is not None:
        dropped = sum(
            max(record.stats.get(key, 0) - before.stats.get(key, 0), 0) for key in ("drop", "early_drop")
        )
    fill = record.count / record.max
    if fill < WARN_FILL and dropped == 0:
        return [], f"conntrack: {record.count} of {record.max} entries ({fill:.0%})"
    fix = sysctl_fix("net.netfilter.nf_conntrack_max", record.max * 2)
    return [
        Finding(
            id="conntrack-full",
            severity=Severity.CRITICAL if fill >= CRITICAL_FILL or dropped else Severity.WARNING,
            subject="nf_conntrack",
            title=f"conntrack table {fill:.0%} full ({record.count} of {record.max})",
            evidence={
                "count": record.count,
                "max": record.max,
                "drops_per_s": round(window.per_second(dropped), 1),
            },
            explanation=cause("conntrack_full").explain(),
            fix_commands=fix.commands,
            persistent=fix.persistent,
            actions=fix.actions,
            cause_code="conntrack_full",
        )
    ], ""


def check_conntrack_invalid(window: Window) -> Verdict:
    after, before = window.after.conntrack, window.before.conntrack
    if after is None or before is None:
        return [], ""
    invalid = max(after.stats.get("invalid", 0) - before.stats.get("invalid", 0), 0)
    rate = window.per_second(invalid)
    if rate < MIN_INVALID_PER_S:
        return [], "conntrack: invalid packets not rising"
    liberal = window.after.sysctl_int("net.netfilter.nf_conntrack_tcp_be_liberal")
    fix = sysctl_fix("net.netfilter.nf_conntrack_tcp_be_liberal", 1) if liberal == 0 else None
    return [
        Finding(
            id="conntrack-invalid",
            severity=Severity.WARNING,
            subject="nf_conntrack",
            title=f"conntrack marks {rate:.1f} packets/s INVALID",
            evidence={"invalid_per_s": round(rate, 1), "nf_conntrack_tcp_be_liberal": liberal},
            explanation=(
                cause("conntrack_invalid").explain()
                + (
                    "nf_conntrack_tcp_be_liberal = 1 makes conntrack accept out-of-window segments; prefer "
                    "fixing "
                    "the asymmetry if there is one."
                    if fix
                    else "be_liberal is already on, so look for asymmetric routing or non-TCP invalids."
                )
            ),
            fix_commands=fix.commands if fix else (),
            persistent=fix.persistent if fix else (),
            actions=fix.actions if fix else (),
            cause_code="conntrack_invalid",
        )
    ], ""


RULES = [Rule("conntrack-full", check_conntrack_fill), Rule("conntrack-invalid", check_conntrack_invalid)]
