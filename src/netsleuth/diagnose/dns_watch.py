"""`diagnose`'s DNS watch: the dns programs for the diagnosis window, then `dns_rules` on what they saw.

Only what a verdict needs reaches Python: SERVFAIL/REFUSED answers (filtered in the kernel), timeouts (the
pending-table sweep) and dropped DNS packets; every other answer is only counted in the kernel's groups,
which the search-list and NXDOMAIN rules read at the end. If the programs cannot load, the diagnosis goes on
without DNS and says why (`problem`), as it does for the tcp programs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnose.dns_rules import absorb_firewall_verdicts, dns_verdicts
from netsleuth.diagnose.session_watch import SessionWatch
from netsleuth.diagnose.verdicts import Verdict

if TYPE_CHECKING:
    from netsleuth.diagnostics.dns.records import DnsRecord
    from netsleuth.diagnostics.dns.session import DnsDiagnostic  # noqa: F401 - the quoted base's parameter
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.kernel.context import KernelContext

__all__ = ["DnsWatch"]

_MAX_RECORDS = 10_000  # enough evidence for any verdict; a storm's rest is in the kernel's counts


class DnsWatch(SessionWatch["DnsDiagnostic"]):
    watched = "DNS"

    def __init__(self, packet_filter: PacketFilter, context: KernelContext, duration: float) -> None:
        from netsleuth.diagnostics.dns.records import TIMEOUT_RCODE, DnsConfig
        from netsleuth.diagnostics.dns.session import DnsDiagnostic

        # A query unanswered for half the window (at most the resolver default of 5 s) is a timeout.
        timeout = min(5.0, max(0.5, duration / 2))
        config = DnsConfig(rcode=("SERVFAIL", "REFUSED", TIMEOUT_RCODE), timeout=timeout)
        # diagnose's own filter, already resolved on this host, stands for the config's packet filters.
        super().__init__(DnsDiagnostic(config, context, packet_filter=packet_filter))
        self._records: list[DnsRecord] = []

    def _keep(self, records: list[DnsRecord]) -> None:
        self._records.extend(records[: max(0, _MAX_RECORDS - len(self._records))])

    def poll(self) -> None:
        if self._session is not None:
            self._keep(self._session.poll(0))

    def verdicts(self, seconds: float, drop_verdicts: list[Verdict]) -> tuple[list[Verdict], list[Verdict]]:
        """The DNS verdicts, and `drop_verdicts` less the firewall verdicts a DNS verdict absorbed (the same
        rule dropping the same DNS packets: one fault, one verdict)."""
        if self._session is None:
            return [], drop_verdicts
        self._keep(self._session.drain())
        found = dns_verdicts(self._records, self._session.summary(False).rows, seconds)
        return absorb_firewall_verdicts(found, drop_verdicts, self._records)
