"""Every collector the exporter serves, each registered in its own file (node_exporter's collectors).

A module of this package exports `COLLECTORS`, the host counters it reads (netsleuth.spec.collectors); a
diagnostic offers the collectors of its own programs on its spec (`DiagnosticSpec.collectors`).
`registered()` finds both - this package's modules by listing it, the diagnostics' in the registry - so adding
a collector is its file (or its spec's entry) and nothing else.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from netsleuth.spec.collectors import ExporterCollector

__all__ = ["registered"]


@functools.cache
def registered() -> tuple[ExporterCollector, ...]:
    """This package's collectors (by file name), then the diagnostics' (in the registry's order). An
    attached one starts in that order, and the first one's attach kind is the agent's (drops')."""
    from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic

    own = [
        offer
        for module in sorted(info.name for info in pkgutil.iter_modules(__path__))
        for offer in importlib.import_module(f"{__name__}.{module}").COLLECTORS
    ]
    offered = [
        offer
        for name in diagnostic_names()
        for offer in getattr(get_diagnostic(name), "collectors", ())
        if isinstance(offer, ExporterCollector)
    ]
    found = (*own, *offered)
    names = [item.name for item in found]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:  # a programming error: their scrape timings would be one series
        raise ValueError(f"two exporter collectors are named {duplicated[0]!r}")
    return found
