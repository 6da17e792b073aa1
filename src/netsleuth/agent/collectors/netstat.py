"""TCP and UDP trouble counters for Prometheus, from /proc/net/snmp, /proc/net/netstat and /proc/net/snmp6.

These are the kernel's exact MIB counters (include/uapi/linux/snmp.h), read by doctor/procfs.py: resets
and aborts by cause, retransmissions, listen-queue overflows, socket-buffer drops. They cover the agent's
own network namespace (the host's, under systemd); per-namespace figures come from the drops counters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from netsleuth.doctor.procfs import read_netstat
from netsleuth.spec.collectors import CollectorInputs, ExporterCollector

__all__ = ["COLLECTORS", "NETSTAT_METRICS", "NetstatCollector", "NetstatMetric"]


@dataclass(frozen=True)
class NetstatMetric:
    name: str
    help: str
    label: str | None = None
    sources: tuple[tuple[str, str], ...] = ()  # (label value or "", MIB key)


def _single(name: str, key: str, help_text: str) -> NetstatMetric:
    return NetstatMetric(name, f"{help_text} ({key})", None, (("", key),))


def _udp(name: str, field: str, help_text: str) -> NetstatMetric:
    return NetstatMetric(
        name,
        f"{help_text} (Udp.{field}, Udp6.{field})",
        "family",
        (("ipv4", f"Udp.{field}"), ("ipv6", f"Udp6.{field}")),
    )


NETSTAT_METRICS: tuple[NetstatMetric, ...] = (
    _single("netsleuth_tcp_resets_sent", "Tcp.OutRsts", "TCP segments sent with the RST flag"),
    _single(
        "netsleuth_tcp_established_resets",
        "Tcp.EstabResets",
        "TCP connections reset from ESTABLISHED or CLOSE_WAIT, by either side",
    ),
    NetstatMetric(
        "netsleuth_tcp_aborts",
        "TCP connections the kernel aborted, by cause: data (closed with unread data: RST sent), close "
        "(data arrived after close: RST sent), memory (out of socket memory: RST sent), timeout (too many "
        "retransmissions), linger (SO_LINGER 0 or FIN_WAIT2 timeout: RST sent), failed (could not send "
        "the RST) (TcpExt.TCPAbortOn*)",
        "cause",
        (
            ("data", "TcpExt.TCPAbortOnData"),
            ("close", "TcpExt.TCPAbortOnClose"),
            ("memory", "TcpExt.TCPAbortOnMemory"),
            ("timeout", "TcpExt.TCPAbortOnTimeout"),
            ("linger", "TcpExt.TCPAbortOnLinger"),
            ("failed", "TcpExt.TCPAbortFailed"),
        ),
    ),
    _single("netsleuth_tcp_retransmitted_segments", "Tcp.RetransSegs", "TCP segments retransmitted"),
    _single("netsleuth_tcp_syn_retransmits", "TcpExt.TCPSynRetrans", "SYN and SYN-ACK retransmissions"),
    _single("netsleuth_tcp_timeouts", "TcpExt.TCPTimeouts", "TCP retransmission timer expiries"),
    _single(
        "netsleuth_tcp_listen_overflows",
        "TcpExt.ListenOverflows",
        "Connections dropped because a listener's accept queue was full",
    ),
    _single(
        "netsleuth_tcp_listen_drops",
        "TcpExt.ListenDrops",
        "SYNs and final ACKs a listener dropped, for any reason (includes overflows)",
    ),
    _single(
        "netsleuth_tcp_syn_queue_drops",
        "TcpExt.TCPReqQFullDrop",
        "SYNs dropped because the SYN queue was full and syncookies were off",
    ),
    _single(
        "netsleuth_tcp_backlog_drops",
        "TcpExt.TCPBacklogDrop",
        "Segments dropped because a socket's backlog was full while its owner held the lock",
    ),
    _single(
        "netsleuth_tcp_receive_queue_drops",
        "TcpExt.TCPRcvQDrop",
        "Segments dropped because the socket's receive buffer was full under memory pressure",
    ),
    _single(
        "netsleuth_tcp_out_of_order_drops", "TcpExt.TCPOFODrop", "Out-of-order segments dropped (no room)"
    ),
    _single(
        "netsleuth_tcp_zero_window_drops",
        "TcpExt.TCPZeroWindowDrop",
        "Segments dropped because the receive window was zero",
    ),
    _single(
        "netsleuth_tcp_memory_pressures",
        "TcpExt.TCPMemoryPressures",
        "Times TCP entered memory pressure (net.ipv4.tcp_mem)",
    ),
    _udp(
        "netsleuth_udp_receive_buffer_errors",
        "RcvbufErrors",
        "UDP datagrams dropped because the receiving socket's buffer was full",
    ),
    _udp(
        "netsleuth_udp_send_buffer_errors",
        "SndbufErrors",
        "UDP datagrams not sent because the socket's send buffer was full",
    ),
    _udp("netsleuth_udp_no_port", "NoPorts", "UDP datagrams to a port nobody listens on"),
    _udp(
        "netsleuth_udp_receive_errors",
        "InErrors",
        "UDP datagrams received with errors (includes buffer drops)",
    ),
    _udp(
        "netsleuth_udp_memory_errors",
        "MemErrors",
        "UDP datagrams dropped for lack of socket memory (udp_mem)",
    ),
)


class NetstatCollector:
    def __init__(self, root: Path = Path("/")) -> None:
        self._root = root

    def collect(self) -> Iterable[Metric]:
        counters = read_netstat(self._root)
        families: list[Metric] = []
        for metric in NETSTAT_METRICS:
            family = CounterMetricFamily(
                metric.name, metric.help, labels=[metric.label] if metric.label else []
            )
            for label_value, key in metric.sources:
                if key in counters:
                    family.add_metric([label_value] if metric.label else [], counters[key])
            families.append(family)
        return families


def _collector(_source: None, inputs: CollectorInputs) -> NetstatCollector:
    return NetstatCollector(inputs.root)


# [exporter] tcp = true|false
COLLECTORS = (ExporterCollector("netstat", lambda exporter: exporter.tcp, _collector),)
