"""A summary is one consistent read even while the traced events keep coming: its total equals the sum of
its groups plus what it counted as left out of them (`ungrouped`), exactly.

Each test keeps a storm running in a namespace while the diagnostic ends its run (`drain`, then `summary`)
the way the CLI, the agent and the fleet do. Read while the programs still counted, the totals and the groups
were read at different moments: the groups, read last, held more than the total said (resets: hundreds more
under this storm). The programs stop (detached, and any still running on another CPU returned) before the
last read, so nothing moves while the summary is read.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from ipaddress import ip_network
from typing import Any

from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair

# Connections to a port nobody listens on, as fast as one process can, for at most a minute: each is an RST
# sent in b and one received in a.
_REFUSED_STORM = """
import socket, sys, time
end = time.monotonic() + 60
while time.monotonic() < end:
    s = socket.socket()
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except OSError:
        pass
    s.close()
"""


@contextmanager
def _storm(host: Host, program: str, *args: str) -> Iterator[None]:
    process = host.popen([sys.executable, "-c", program, *args], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        process.kill()
        process.wait()


def _end_while_storming(diagnostic: Any, matched: int = 2000) -> tuple[Any, int]:
    """Start, let the storm count `matched` events, then end the run as every caller does - the storm goes
    on. Returns the summary and the total read again a moment later (a stopped run's no longer moves)."""
    diagnostic.start()
    try:
        wait_for(lambda: diagnostic.totals().matched >= matched, 60, f"{matched} events counted")
        diagnostic.drain()
        summary = diagnostic.summary(False)
        time.sleep(0.2)
        return summary, diagnostic.totals().matched
    finally:
        diagnostic.close()


def test_resets_summary_total_is_its_groups(pair: Pair) -> None:
    from netsleuth.diagnostics.tcp.records import ResetRecord, ResetsConfig
    from netsleuth.diagnostics.tcp.session import ResetsDiagnostic

    config = ResetsConfig(summary=True, host=(ip_network(pair.b4),), port=7091)
    with _storm(pair.a, _REFUSED_STORM, pair.b4, "7091"):
        summary, later = _end_while_storming(ResetsDiagnostic(config))
    resets = sum(group.count for group in summary.groups if isinstance(group.example, ResetRecord))
    assert (summary.total, summary.ungrouped) == (resets + summary.ungrouped, summary.ungrouped), resets
    assert summary.total == summary.sent.total + summary.received.total + summary.firewall.total
    assert later == summary.total


# Opens of one file, as fast as one process can, for at most a minute.
_OPEN_STORM = """
import os, time
end = time.monotonic() + 60
while time.monotonic() < end:
    os.close(os.open('/dev/null', os.O_RDONLY))
"""


def test_snoop_summary_total_is_its_groups(pair: Pair) -> None:
    from netsleuth.diagnostics.snoop.records import SnoopConfig
    from netsleuth.diagnostics.snoop.session import SnoopDiagnostic

    config = SnoopConfig(summary=True, netns=pair.a.name)
    with _storm(pair.a, _OPEN_STORM):
        summary, later = _end_while_storming(SnoopDiagnostic("open", config), matched=20_000)
    grouped = sum(group.count for group in summary.groups)
    assert (summary.total, summary.ungrouped) == (grouped + summary.ungrouped, summary.ungrouped), grouped
    assert later == summary.total
