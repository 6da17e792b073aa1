"""`netsleuth agent`: a long-running service over the same diagnostics the CLI runs.

- exporter: prometheus_client collectors that read BPF maps and /proc at scrape time (exact counters);
- sessions: bounded, filtered diagnostic runs on request, streamed as the CLI's JSON lines;
- http: /metrics, /healthz, /readyz and the session API (unix socket; TCP only with a token);
- service: start/stop order, so SIGTERM detaches cleanly.
"""

__all__: list[str] = []
