"""`diagnose` as a registered diagnostic: path health, drops, resets and retransmits watched together for
`duration` seconds, then ranked verdicts (netsleuth.diagnose.run)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsleuth.diagnose.run import DiagnoseConfig, DiagnosisSession
from netsleuth.diagnostics.filters import FILTER_KEYS, read_packet_filter
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, RunOptions
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelContext

__all__ = ["DEFAULT_DURATION", "DIAGNOSTIC", "read_diagnose_config"]

DEFAULT_DURATION = 10.0
_MAX_DURATION = 3600.0


def read_diagnose_config(values: ConfigInput) -> DiagnoseConfig:
    from netsleuth.kernel.netns import NetnsNames

    duration = values.number("duration")
    duration = DEFAULT_DURATION if duration is None else duration
    if not 0 < duration <= _MAX_DURATION:
        raise UsageError(f"--duration must be more than 0 and at most {_MAX_DURATION:g} seconds")
    packet_filter = read_packet_filter(values)
    netns_name = None
    if packet_filter.netns is not None:
        # doctor reads devices and sysctls from inside the namespace: by its name or a process in it.
        names = NetnsNames()
        netns_name = names.name_of(packet_filter.netns) or names.path_of(packet_filter.netns)
    pod, k8s_namespace = values.text("pod"), values.text("k8s_namespace")
    pods = f"pod {pod}" if pod else f"Kubernetes namespace {k8s_namespace}" if k8s_namespace else None
    return DiagnoseConfig(duration=duration, packet_filter=packet_filter, netns_name=netns_name, pods=pods)


def _open(config: DiagnoseConfig, context: KernelContext | None) -> DiagnosisSession:
    return DiagnosisSession(config, context)


DIAGNOSTIC: DiagnosticSpec[DiagnoseConfig] = DiagnosticSpec(
    name="diagnose",
    help="watch drops, resets, retransmits and path health together; print ranked verdicts with fixes",
    keys=(*FILTER_KEYS, *RunOptions.KEYS),
    read=read_diagnose_config,
    open=_open,
    objects=("drops", "tcp"),
    records=("verdict", "summary"),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
)
