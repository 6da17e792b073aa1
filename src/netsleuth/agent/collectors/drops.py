"""The exporter's drop counters: a thin registration of agent/drops_collector.py and its always-on summary
attachment (agent/drops_source.py), until drops is a typed package that offers them on its spec
(`DiagnosticSpec.collectors`, as dns does) - then this file goes (issue 21)."""

from __future__ import annotations

from netsleuth.agent.drops_collector import DropsCollector
from netsleuth.agent.drops_source import ExporterDropsSession
from netsleuth.agent.function_names import FunctionNames
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector

__all__ = ["COLLECTORS"]


def _source(inputs: CollectorInputs) -> ExporterDropsSession:
    return ExporterDropsSession(inputs.reasons)


def _collector(source: ExporterDropsSession, inputs: CollectorInputs) -> DropsCollector:
    return DropsCollector(source, inputs.reasons, FunctionNames(), inputs.exporter.drops)


# [exporter.drops]
COLLECTORS = (ExporterCollector("drops", lambda exporter: exporter.drops.enabled, _collector, _source),)
