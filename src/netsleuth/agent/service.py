"""The agent: one always-on summary attachment feeding the exporter, the session runner, the HTTP servers.

Start order: check privileges -> turn on bpf_stats -> attach the exporter's BPF sources (drops', dns' if on)
-> register the collectors (netsleuth.agent.collectors: each in its own file or on its diagnostic's spec) ->
bind the servers -> ready. Stop order (SIGTERM): not ready -> end every session with reason agent_stopping
(they send their summary) -> stop accepting and wait for responses in flight -> detach. Links belong to this
process and are never pinned, so a SIGKILL leaves nothing attached either: the kernel releases them with the
last fd.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from netsleuth.agent.collectors import registered
from netsleuth.agent.config import AgentConfig
from netsleuth.agent.http import TcpServer, UnixServer, bind_tcp, bind_unix
from netsleuth.agent.programs import ProgramLedger
from netsleuth.agent.self_collector import ScrapeTimings, SelfCollector, TimedCollector
from netsleuth.agent.session_diagnostics import DiagnosticContext
from netsleuth.agent.sessions import SessionManager
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.stats import RunTimeStats, bpf_stats_sysctl_enabled
from netsleuth.kernel.reasons import load_drop_reasons
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector, ExporterSource

if TYPE_CHECKING:
    from netsleuth.fleet.agent_link import FleetLink

__all__ = ["Agent"]

_LOG = logging.getLogger("netsleuth.agent")


class Agent:
    def __init__(
        self, config: AgentConfig, registry: CollectorRegistry | None = None, root: Path = Path("/")
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.root = root
        self.ledger = ProgramLedger()
        self.timings = ScrapeTimings()
        self._ready = threading.Event()
        self._run_time_stats: RunTimeStats | None = None
        # The exporter's collectors that are on, each with its started BPF source (None: it has none) and
        # that source's programs in the ledger.
        self._exporting: list[tuple[ExporterCollector, ExporterSource | None]] = []
        self._source_handles: list[int] = []
        self._servers: list[TcpServer | UnixServer] = []
        self._threads: list[threading.Thread] = []
        self._collectors: list[Collector] = []
        self._sessions: SessionManager | None = None
        self.tcp_server: TcpServer | None = None
        self.unix_server: UnixServer | None = None
        self.fleet: FleetLink | None = None  # [fleet]: the link to NATS and the controller (fleet/)

    # -- state -----------------------------------------------------------------------------------------
    @property
    def sessions(self) -> SessionManager:
        if self._sessions is None:
            raise RuntimeError("the agent has not started")
        return self._sessions

    def is_ready(self) -> bool:
        return self._ready.is_set()

    def bpf_stats_enabled(self) -> bool:
        own = self._run_time_stats is not None and self._run_time_stats.enabled
        return own or bpf_stats_sysctl_enabled()

    @property
    def attach_kind(self) -> str:
        """How the first of the exporter's BPF sources attached (drops'), "" with none."""
        kinds = [source.attach_kind for _, source in self._exporting if source is not None]
        return kinds[0] if kinds else ""

    # -- start -----------------------------------------------------------------------------------------
    def _enable_bpf_stats(self) -> None:
        if not self.config.bpf_stats:
            return
        self._run_time_stats = RunTimeStats()
        if not self.bpf_stats_enabled():
            _LOG.warning(
                "BPF run-time accounting is off (BPF_ENABLE_STATS needs CAP_SYS_ADMIN; or set "
                "kernel.bpf_stats_enabled=1): no run-time metrics, and sessions are refused"
            )

    def _register(self, name: str, collector: Collector) -> None:
        timed = TimedCollector(name, collector, self.timings)
        self.registry.register(timed)
        self._collectors.append(timed)

    def _register_collectors(self, inputs: CollectorInputs) -> None:
        for offer, source in self._exporting:
            self._register(offer.name, offer.collector(source, inputs))
        process = ProcessCollector(registry=None)
        self.registry.register(process)
        self._collectors.append(process)
        own = SelfCollector(
            self.ledger, self.sessions.stats, self.timings, self.bpf_stats_enabled, self.is_ready
        )
        self.registry.register(own)  # last: it reports the timings of the scrape it is part of
        self._collectors.append(own)

    def _attach_exporter(self, inputs: CollectorInputs) -> None:
        """Start the BPF source of every collector that is on, in the registry's order (drops first)."""
        for offer in registered():
            if not offer.enabled(self.config.exporter):
                continue
            if offer.source is None:
                self._exporting.append((offer, None))
                continue
            source = offer.source(inputs)
            try:
                source.start()
            except BaseException:
                source.close()
                raise
            self._exporting.append((offer, source))
            self._source_handles += [
                self.ledger.attached("exporter", program, fd) for program, fd in source.program_fds().items()
            ]

    def _serve(self, server: TcpServer | UnixServer, name: str) -> None:
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=name)
        thread.start()
        self._servers.append(server)
        self._threads.append(thread)

    def start(self) -> None:
        """Attach and serve; on any failure everything started so far is undone."""
        try:
            self._start()
        except BaseException:
            self.stop(timeout=5)
            raise

    def _start(self) -> None:
        attaching = any(
            offer.source is not None and offer.enabled(self.config.exporter) for offer in registered()
        )
        if attaching or self.config.sessions.enabled:
            require_tracing()
        context = DiagnosticContext(reasons=load_drop_reasons())
        inputs = CollectorInputs(exporter=self.config.exporter, root=self.root, reasons=context.reasons)
        self._enable_bpf_stats()
        self._attach_exporter(inputs)
        self._sessions = SessionManager(self.config.sessions, context, self.ledger, self.bpf_stats_enabled)
        self._register_collectors(inputs)
        if self.config.fleet is not None:
            from netsleuth.fleet.agent_link import FleetLink  # nats-py is loaded by fleet agents only

            self.fleet = FleetLink(
                self.config.fleet, self.config.sessions, context, self.ledger, self.bpf_stats_enabled
            )
            self.fleet.start()
            from netsleuth.fleet.metrics import FleetCollector

            self._register("fleet", FleetCollector(self.fleet))
        self.tcp_server = bind_tcp(self.config.listen, self, self.config.token())
        self._serve(self.tcp_server, "netsleuth-http")
        if self.config.socket is not None:
            self.unix_server = bind_unix(self.config.socket, self.config.socket_mode, self)
            self._serve(self.unix_server, "netsleuth-unix")
        self._ready.set()
        _LOG.info(
            "ready: metrics on http://%s/metrics%s, exporter attached via %s",
            self.tcp_server.bound,
            f", sessions on {self.config.socket}" if self.config.socket else "",
            self.attach_kind or "nothing (drops exporter disabled)",
        )

    # -- stop ------------------------------------------------------------------------------------------
    def stop(self, timeout: float = 20.0) -> None:
        """Graceful: sessions end with their summary, responses in flight finish, then detach."""
        self._ready.clear()
        if self.fleet is not None:
            self.fleet.stop(timeout)
            self.fleet = None
        if self._sessions is not None and not self._sessions.stop_all(timeout):
            _LOG.warning("some sessions did not end within %.0f s", timeout)
        for server in self._servers:
            server.shutdown()  # stop accepting; returns once serve_forever has
        for server in self._servers:
            server.server_close()  # joins the handler threads: responses in flight complete
        for thread in self._threads:
            thread.join(timeout)
        self._servers.clear()
        self._threads.clear()
        for collector in self._collectors:
            with contextlib.suppress(KeyError):
                self.registry.unregister(collector)
        self._collectors.clear()
        for handle in self._source_handles:
            self.ledger.detaching(handle)
        self._source_handles.clear()
        for _, source in self._exporting:
            if source is not None:
                source.close()
        self._exporting.clear()
        if self._run_time_stats is not None:
            self._run_time_stats.close()
            self._run_time_stats = None
