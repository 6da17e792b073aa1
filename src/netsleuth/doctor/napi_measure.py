"""What net_rx_action really did during doctor's sampling window, measured with the `softirq` diagnostic's
programs (irq:softirq_entry/exit and napi:napi_poll, bpf/softirq.bpf.c): per CPU, the NET_RX runs and how
many stopped on netdev_budget (packets) or on netdev_budget_usecs (time); per device, the NAPI polls and
how many used their whole weight. The time-squeeze rule (rules/softnet.py) judges these figures instead of
inferring from /proc/net/softnet_stat, whose time_squeeze does not say which budget ran out.

The figures are plain data that round-trip through JSON: `doctor --record` saves them beside the two
snapshots and `--replay` judges them again.

NET_RX runs are per CPU, not per namespace, so the programs watch every CPU and every device on the host,
also under --netns; each device keeps the namespace it lives in.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.errors import NetsleuthError

if TYPE_CHECKING:
    from netsleuth.diagnostics.softirq.counts import NapiInstance, NetRxRuns
    from netsleuth.diagnostics.softirq.session import SoftirqDiagnostic

__all__ = ["CpuNetRx", "DeviceNapi", "NapiMeasurement", "NapiProbe", "between", "bpf_unusable"]

BACKLOG = "backlog"  # the per-CPU process_backlog NAPI (RPS, netif_rx, loopback) has no device


@dataclass(frozen=True)
class CpuNetRx:
    """One CPU's net_rx_action runs in the window."""

    cpu: int
    runs: int
    packets: int
    budget_runs: int  # stopped with netdev_budget packets done
    time_runs: int  # lasted netdev_budget_usecs or longer
    exhausted_polls: int  # NAPI polls on this CPU that used their whole weight
    # The kernel's own count of stopped runs (softnet_stat time_squeeze), read right after the programs'
    # counters: the same window, so it checks the split above (budget_runs + time_runs).
    time_squeeze: int = 0

    @property
    def stopped(self) -> int:
        return self.budget_runs + self.time_runs


@dataclass(frozen=True)
class DeviceNapi:
    """The NAPI instances of one device (a multi-queue NIC has one per queue), summed."""

    dev: str  # BACKLOG for the per-CPU backlog
    netns: int  # inode
    netns_name: str | None
    in_measured_netns: bool  # the namespace doctor measured (--netns, or its own)
    in_own_netns: bool  # doctor's own process namespace: commands for it need no `ip netns exec`
    instances: int
    weight: int  # the budget each poll is given (dev_weight / the driver's NAPI weight)
    polls: int
    packets: int
    exhausted_polls: int  # polls whose work reached the weight: the device had more than one poll's worth
    polls_by_cpu: dict[str, int]

    @property
    def label(self) -> str:
        if self.dev == BACKLOG:
            return "per-CPU backlog"
        if self.in_measured_netns:
            return self.dev
        return f"{self.dev} (netns {self.netns_name or self.netns})"

    def busiest_cpu_share(self) -> tuple[int, float]:
        """(CPU, share of this device's polls it ran)."""
        if not self.polls_by_cpu or not self.polls:
            return -1, 0.0
        cpu, polls = max(self.polls_by_cpu.items(), key=lambda item: item[1])
        return int(cpu), polls / self.polls


@dataclass(frozen=True)
class NapiMeasurement:
    seconds: float
    netdev_budget: int
    netdev_budget_usecs: int
    attach: str  # tp_btf or raw_tp
    cpus: tuple[CpuNetRx, ...]
    devices: tuple[DeviceNapi, ...]  # by polls, most first

    @property
    def runs(self) -> int:
        return sum(cpu.runs for cpu in self.cpus)

    @property
    def packets(self) -> int:
        return sum(cpu.packets for cpu in self.cpus)

    @property
    def budget_runs(self) -> int:
        return sum(cpu.budget_runs for cpu in self.cpus)

    @property
    def time_runs(self) -> int:
        return sum(cpu.time_runs for cpu in self.cpus)

    @property
    def stopped(self) -> int:
        return self.budget_runs + self.time_runs

    def to_json(self) -> dict[str, Any]:
        # Seconds unrounded: a replay of a recording must judge the same rates to the last digit.
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> NapiMeasurement:
        return cls(
            seconds=float(raw["seconds"]),
            netdev_budget=int(raw["netdev_budget"]),
            netdev_budget_usecs=int(raw["netdev_budget_usecs"]),
            attach=str(raw.get("attach", "")),
            cpus=tuple(CpuNetRx(**cpu) for cpu in raw.get("cpus", ())),
            devices=tuple(
                DeviceNapi(**{**device, "polls_by_cpu": dict(device["polls_by_cpu"])})
                for device in raw.get("devices", ())
            ),
        )


def _devices(napi: list[NapiInstance], measured_netns: int, own_netns: int) -> tuple[DeviceNapi, ...]:
    grouped: dict[tuple[int, int, str], list[NapiInstance]] = {}
    for instance in napi:
        dev = instance.dev or BACKLOG
        grouped.setdefault((instance.netns, instance.ifindex, dev), []).append(instance)
    devices = []
    for (netns, _, dev), instances in grouped.items():
        by_cpu: dict[str, int] = {}
        for instance in instances:
            for cpu, polls in instance.polls_by_cpu.items():
                by_cpu[str(cpu)] = by_cpu.get(str(cpu), 0) + polls
        devices.append(
            DeviceNapi(
                dev=dev,
                netns=netns,
                netns_name=instances[0].netns_name,
                # The backlog is per CPU, in no namespace: it counts as the host's.
                in_measured_netns=dev == BACKLOG or netns == measured_netns,
                in_own_netns=dev == BACKLOG or netns == own_netns,
                instances=len(instances),
                weight=max(instance.budget for instance in instances),
                polls=sum(instance.polls for instance in instances),
                packets=sum(instance.work for instance in instances),
                exhausted_polls=sum(instance.exhausted for instance in instances),
                polls_by_cpu=dict(sorted(by_cpu.items(), key=lambda item: int(item[0]))),
            )
        )
    return tuple(sorted(devices, key=lambda device: (-device.polls, device.dev)))


def _cpus(net_rx: list[NetRxRuns], squeezes: dict[int, int]) -> tuple[CpuNetRx, ...]:
    return tuple(
        CpuNetRx(
            cpu=runs.cpu if runs.cpu is not None else -1,
            runs=runs.runs,
            packets=runs.work,
            budget_runs=runs.budget_runs,
            time_runs=runs.time_runs,
            exhausted_polls=runs.exhausted_polls,
            time_squeeze=squeezes.get(runs.cpu if runs.cpu is not None else -1, 0),
        )
        for runs in net_rx
    )


def bpf_unusable(root: Path, no_bpf: bool) -> str | None:
    """Why doctor will not measure with BPF this run (None: it will try)."""
    if no_bpf:
        return "--no-bpf"
    if root != Path("/"):
        return f"the counters come from {root}, not from this running kernel"
    return None


def _device_key(device: DeviceNapi) -> tuple[int, str]:
    return device.netns, device.dev


def between(first: NapiMeasurement, second: NapiMeasurement) -> NapiMeasurement:
    """What happened from `first` to `second`, two reads of the same attached programs' counters."""
    earlier_cpus = {cpu.cpu: cpu for cpu in first.cpus}
    earlier_devices = {_device_key(device): device for device in first.devices}
    cpus = []
    for cpu in second.cpus:
        old = earlier_cpus.get(cpu.cpu, CpuNetRx(cpu.cpu, 0, 0, 0, 0, 0))
        cpus.append(
            CpuNetRx(
                cpu=cpu.cpu,
                runs=cpu.runs - old.runs,
                packets=cpu.packets - old.packets,
                budget_runs=cpu.budget_runs - old.budget_runs,
                time_runs=cpu.time_runs - old.time_runs,
                exhausted_polls=cpu.exhausted_polls - old.exhausted_polls,
                time_squeeze=cpu.time_squeeze - old.time_squeeze,
            )
        )
    devices = []
    for device in second.devices:
        old_device = earlier_devices.get(_device_key(device))
        if old_device is None:
            devices.append(device)
            continue
        if device.polls == old_device.polls:
            continue  # no poll in the window
        by_cpu = {
            cpu: polls - old_device.polls_by_cpu.get(cpu, 0)
            for cpu, polls in device.polls_by_cpu.items()
            if polls > old_device.polls_by_cpu.get(cpu, 0)
        }
        devices.append(
            replace(
                device,
                polls=device.polls - old_device.polls,
                packets=device.packets - old_device.packets,
                exhausted_polls=device.exhausted_polls - old_device.exhausted_polls,
                polls_by_cpu=by_cpu,
            )
        )
    return replace(
        second,
        seconds=second.seconds - first.seconds,
        cpus=tuple(cpus),
        devices=tuple(sorted(devices, key=lambda device: (-device.polls, device.dev))),
    )


class NapiProbe:
    """The softirq programs attached for one sampling window. `start` never raises: when the programs
    cannot be loaded (not root, no BTF, a tracepoint missing) `problem` says why, `read` returns None, and
    the rule falls back to inferring. `read` gives the counters since attach; doctor reads them right
    before each snapshot and judges the difference (`between`), so the measured window is the snapshots'
    window, not the programs' load time too."""

    def __init__(self, netns: str | None) -> None:
        self.netns = netns
        self.problem: str | None = None
        self._session: SoftirqDiagnostic | None = None
        self._measured_netns = 0
        self._own_netns = 0
        self._started = 0.0

    def start(self) -> None:
        from netsleuth.diagnostics.softirq.records import SoftirqConfig
        from netsleuth.diagnostics.softirq.session import SoftirqDiagnostic
        from netsleuth.kernel.netns import current_netns_inode, resolve_netns_arg

        self._own_netns = current_netns_inode()
        try:
            self._measured_netns = (
                resolve_netns_arg(self.netns) if self.netns is not None else self._own_netns
            )
            # No netns or device filter: the CPUs' runs are shared by every namespace's devices.
            session = SoftirqDiagnostic(SoftirqConfig())
        except (NetsleuthError, OSError) as error:
            self.problem = str(error)
            return
        try:
            session.start()
        except (NetsleuthError, OSError) as error:
            self.problem = str(error)
            session.close()
            return
        self._session = session
        self._started = time.monotonic()

    def read(self) -> NapiMeasurement | None:
        """The counters since attach; softnet_stat is read right after the NET_RX counters so the kernel's
        time_squeeze covers the same moments."""
        from netsleuth.doctor.procfs import read_softnet

        session = self._session
        if session is None:
            return None
        try:
            taken = time.monotonic()
            net_rx = session.net_rx_runs()
            squeezes = {row.cpu: row.time_squeeze for row in read_softnet(Path("/"))}
            napi = session.napi_instances()
        except (NetsleuthError, OSError) as error:
            self.problem = f"reading the softirq maps failed: {error}"
            self.close()
            return None
        return NapiMeasurement(
            seconds=taken - self._started,
            netdev_budget=session.budget,
            netdev_budget_usecs=session.budget_usecs,
            attach=session.attach_kind,
            cpus=_cpus(net_rx, squeezes),
            devices=_devices(napi, self._measured_netns, self._own_netns),
        )

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()
