"""softirq without the kernel: vector names from /proc/softirqs, log2 histograms and their percentiles, and
the NET_RX budget verdict `diagnose` makes from exact per-run counts."""

from __future__ import annotations

from pathlib import Path

from netsleuth.diagnostics.softirq.counts import (
    CountHistogram,
    Histogram,
    NapiInstance,
    NetRxRuns,
    VectorStats,
    softirq_summary,
)
from netsleuth.diagnostics.softirq.records import SoftirqSummary
from netsleuth.diagnostics.softirq.rules import net_rx_budget_verdicts
from netsleuth.kernel.softirqs import softirq_names
from netsleuth.spec.summary import ClockPart

PROC_SOFTIRQS = """\
                    CPU0       CPU1
          HI:          0          0
       TIMER:     123456     234567
      NET_TX:         12         34
      NET_RX:    9876543    8765432
       BLOCK:       1000       2000
    IRQ_POLL:          0          0
     TASKLET:         10         20
       SCHED:     100000     200000
     HRTIMER:          0          0
         RCU:      50000      60000
"""


def test_vector_names_in_kernel_order(tmp_path: Path) -> None:
    path = tmp_path / "softirqs"
    path.write_text(PROC_SOFTIRQS)
    assert softirq_names(path) == [
        "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
    ]  # fmt: skip
    assert softirq_names(tmp_path / "missing") == []


def hist(**buckets: int) -> Histogram:
    counts = [0] * 32
    for name, count in buckets.items():
        counts[int(name[1:])] = count
    return Histogram(tuple(counts))


def counts(**buckets: int) -> CountHistogram:
    return CountHistogram(hist(**buckets).buckets)


def test_packet_counts_are_labelled_by_the_lower_edge_the_kernel_bucketed() -> None:
    # bpf/softirq.bpf.c count_bucket: 0 packets in bucket 0, 1 in bucket 1, 2-3 in bucket 2, 4-7 in bucket 3,
    # 64-127 in bucket 7: runs of 1 packet are listed under "1", not under "2".
    runs = counts(b0=3, b1=50, b2=7, b3=2, b7=4)
    assert runs.by_lower_edge() == {"0": 3, "1": 50, "2": 7, "4": 2, "64": 4}
    assert runs.percentile(0.5) == 1  # 1-packet runs hold the median: the largest count in their bucket
    assert runs.percentile(0.9) == 3
    assert runs.percentile(1.0) == 127
    assert counts(b0=2).percentile(0.5) == 0
    assert (counts(b1=1) + counts(b1=2)).by_lower_edge() == {"1": 3}
    assert isinstance(counts(b1=1) + counts(b2=1), CountHistogram)


def test_percentiles_are_upper_bucket_edges() -> None:
    # 90 values in [512, 1024) ns, 9 in [8192, 16384), 1 in [2^20, 2^21).
    latencies = hist(b9=90, b13=9, b20=1)
    assert latencies.count == 100
    assert latencies.percentile(0.5) == 1024
    assert latencies.percentile(0.9) == 1024
    assert latencies.percentile(0.99) == 16384
    assert latencies.percentile(1.0) == 2**21
    assert hist().percentile(0.5) is None
    assert latencies.by_lower_edge() == {"512": 90, "8192": 9, "1048576": 1}
    assert (hist(b0=1) + hist(b0=2)).by_lower_edge() == {"0": 3}


def _vector(cpu: int, runs: int, latency: Histogram) -> VectorStats:
    return VectorStats("NET_RX", cpu, runs, runs, latency, 0, 900_000, hist(b12=runs), 0, 50_000)


def _summary(
    budget_runs: tuple[int, int], time_runs: tuple[int, int], seconds: float = 10.0
) -> SoftirqSummary:
    net_rx = tuple(
        NetRxRuns(cpu, 1000, 2000, 300_000, budget_runs[cpu], time_runs[cpu], 400, counts(b9=1000))
        for cpu in (0, 1)
    )
    napi = NapiInstance(
        netns=0, netns_name=None, dev="eth0", ifindex=2, napi_id=8193, budget=64, polls_by_cpu={0: 2000},
        work=300_000, exhausted=400, idle=0, max_work=64, work_per_poll=counts(b7=2000),
    )  # fmt: skip
    return softirq_summary(
        seconds=seconds,
        budget=300,
        budget_usecs=2000,
        vectors=(_vector(0, 1000, hist(b9=970, b19=30)), _vector(1, 1000, hist(b9=1000))),
        net_rx=net_rx,
        napi=(napi,),
        attach="tp_btf",
        interrupted=False,
        clock=ClockPart(monotonic_ns=0, wall_ns=0, offset_ns=0),
    )


def test_runs_stopped_on_the_packet_budget_make_one_exact_verdict() -> None:
    (verdict,) = net_rx_budget_verdicts(_summary(budget_runs=(150, 0), time_runs=(3, 0)))
    assert verdict.category == "net-rx-budget" and verdict.absorbed_findings == ("time-squeeze",)
    assert verdict.cause.startswith(
        "the NET_RX softirq on CPU 0 stopped 15 times/s with packets left: 150 of 2000"
    )
    assert verdict.evidence["budget_runs_by_cpu"] == {"0": 150}
    assert verdict.evidence["time_runs_by_cpu"] == {"0": 3}
    assert verdict.evidence["net_rx_wait_p99"] == "1049 µs"  # 2^20 ns: the bucket of the slowest 1 %
    assert verdict.evidence["napi_full_polls"] == {"eth0": 400}
    assert verdict.fix[0] == "sysctl -w net.core.netdev_budget=600"


def test_runs_stopped_on_time_point_at_budget_usecs() -> None:
    (verdict,) = net_rx_budget_verdicts(_summary(budget_runs=(0, 5), time_runs=(60, 80)))
    assert "raising netdev_budget would change nothing" in verdict.cause
    assert verdict.fix[0] == "sysctl -w net.core.netdev_budget_usecs=4000"
    assert verdict.evidence["time_runs_by_cpu"] == {"0": 60, "1": 80}


def test_a_few_stopped_runs_are_no_verdict() -> None:
    assert net_rx_budget_verdicts(_summary(budget_runs=(50, 40), time_runs=(0, 0))) == []


def test_the_summary_record_sums_cpus_and_shows_what_was_asked() -> None:
    import jsonschema
    import msgspec

    from netsleuth.spec.records import encode
    from netsleuth.spec.schemas import record_schema

    summary = _summary(budget_runs=(150, 0), time_runs=(3, 0))
    assert isinstance(summary, SoftirqSummary)
    (net_rx,) = summary.vectors
    assert (net_rx.vector, net_rx.cpu, net_rx.runs) == ("NET_RX", None, 2000)
    assert [part.cpu for part in summary.per_cpu] == [0, 1]
    assert net_rx.latency.histogram_ns == {"512": 1970, "524288": 30}
    assert net_rx.latency.p99_ns == 1 << 20 and net_rx.latency.max_ns == 900_000
    assert summary.net_rx is not None and summary.net_rx.packets == 600_000
    assert summary.net_rx.packets_per_run == 300.0 and summary.net_rx.budget_runs == 150
    assert summary.napi[0].polls_by_cpu == {"0": 2000} and summary.napi[0].packets_per_poll_histogram == {
        "64": 2000
    }
    assert (summary.seen, summary.total, summary.lost) == (2000, 2000, 0)
    printed = msgspec.json.decode(encode(summary))
    jsonschema.validate(printed, record_schema(SoftirqSummary))
    assert printed["type"] == "summary" and printed["diagnostic"] == "softirq"
    # --vector shows only what it names; every vector is still measured (and counted in the totals).
    timer = VectorStats("TIMER", 0, 5, 5, hist(b10=5), 0, 2000, hist(b11=5), 0, 4000)
    shown = softirq_summary(
        seconds=1.0,
        budget=300,
        budget_usecs=2000,
        vectors=(timer, _vector(0, 1000, hist(b9=1000))),
        net_rx=(),
        napi=(),
        attach="tp_btf",
        interrupted=False,
        clock=ClockPart(monotonic_ns=0, wall_ns=0, offset_ns=0),
        shown=("TIMER",),
    )
    assert [part.vector for part in shown.vectors] == ["TIMER"] and shown.vector("NET_RX") is None
    assert shown.total == 1005 and shown.net_rx is None
