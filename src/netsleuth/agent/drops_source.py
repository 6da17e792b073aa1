"""The exporter's always-on drops attachment: `netsleuth drops --summary` with no filter, no events.

Namespaces that are gone have their groups removed with `DropsSession.forget_group`, so a long-running agent
on a host where containers come and go does not fill the 8192-group map with the dead.
"""

from __future__ import annotations

from netsleuth._generated.drops_abi import DROPS_MAX_GROUPS
from netsleuth.diagnostics.drops.program import DropsProgramConfig, DropsSession
from netsleuth.kernel.reasons import DropReasons

__all__ = ["DROPS_MAX_GROUPS", "ExporterDropsSession"]


class ExporterDropsSession(DropsSession):
    def __init__(self, reasons: DropReasons) -> None:
        super().__init__(DropsProgramConfig(summary_only=True), reasons)
