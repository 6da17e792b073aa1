"""A compressed soak: minutes of a drop storm, namespaces coming and going, scrapes four times a second and
sessions (finished, capped, over budget, abandoned) one after another. The agent's RSS and fd count must
stay flat, and its counters exact.

NETSLEUTH_AGENT_SOAK_SECONDS sets the length (default 120).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from netsleuth.agent.client import AgentError, StreamCut
from tests.netlab import Lab, run, wait_for
from tests.privileged.conftest import Pair
from tests.privileged.test_agent_harness import AgentProcess

SOAK_SECONDS = float(os.environ.get("NETSLEUTH_AGENT_SOAK_SECONDS", "120"))
CHURN_PORT = 6400
STORM_PORT = 6401


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_targets(pid: int) -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}").split(":[")[0])
        except OSError:
            continue
    return sorted(targets)


def repeat_until(
    stop: threading.Event, errors: list[BaseException], action: Callable[[], None]
) -> threading.Thread:
    def loop() -> None:
        try:
            while not stop.is_set():
                action()
        except BaseException as error:  # reported by the test, not lost in a thread
            errors.append(error)
            stop.set()

    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def test_soak_keeps_rss_and_fds_flat_and_counts_exact(pair: Pair, udpflood: str) -> None:
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", str(STORM_PORT), "-j", "DROP")
    config = {"exporter": {"drops": {"retire_netns_after": 2}}, "sessions": {"max_concurrent": 3}}
    churn = Lab(prefix=f"nss{os.getpid()}")
    with AgentProcess(config) as agent:
        agent.wait_ready()
        agent.http.get("/metrics")
        idle_fds = fd_targets(agent.pid)
        stop = threading.Event()
        quiet = threading.Event()  # set: sessions and scrapes pause so a checkpoint sees the agent at rest
        parked = {"scrape": threading.Event(), "sessions": threading.Event()}

        def parking(loop: str) -> bool:
            """True (after a short wait) while a checkpoint wants this loop to stay still."""
            if quiet.is_set():
                parked[loop].set()
                stop.wait(0.1)
                return True
            parked[loop].clear()
            return False

        errors: list[BaseException] = []
        refused_total = [0]
        namespaces_made = [0]
        cut_streams = [0]

        def storm() -> None:
            result = json.loads(pair.a.run(udpflood, pair.b4, str(STORM_PORT), "500000").stdout)
            refused_total[0] += result["refused"]

        def namespace_churn() -> None:
            # A container's life: a namespace appears, drops something, goes away (and must be retired).
            host = churn.host(f"c{namespaces_made[0] % 1000}")
            host.run(
                "python3",
                "-c",
                f"import socket; socket.socket(2, 2).sendto(b'x', ('127.0.0.1', {CHURN_PORT}))",
            )
            churn.hosts.remove(host)
            run("ip", "netns", "del", host.name)
            namespaces_made[0] += 1
            stop.wait(0.5)

        def scrape() -> None:
            if parking("scrape"):
                return
            status, _ = agent.http.get("/metrics")
            assert status == 200
            stop.wait(0.25)

        def sessions() -> None:
            if parking("sessions"):
                return
            storm_filter = {"netns": pair.a.name, "dport": STORM_PORT}
            for request, abandon in (
                ({"diagnostic": "drops", "filters": storm_filter, "max_events": 2000, "duration": 2}, False),
                ({"diagnostic": "drops", "filters": {"dport": 9}, "duration": 0.5}, False),
                ({"diagnostic": "drops", "filters": storm_filter, "duration": 30}, True),
            ):
                try:
                    stream = agent.client.session(request)
                except AgentError as refused:
                    assert refused.status == 429  # three loops share three slots with the test's own
                    continue
                with stream:
                    try:
                        for count, _ in enumerate(stream):
                            if abandon and count == 100:
                                break
                    except StreamCut:
                        # This process, busy with four loops, read too slowly to finish by the deadline;
                        # the agent cut it off as it must.
                        cut_streams[0] += 1

        threads = [
            repeat_until(stop, errors, storm),
            repeat_until(stop, errors, namespace_churn),
            repeat_until(stop, errors, scrape),
            repeat_until(stop, errors, sessions),
        ]
        samples: list[tuple[float, int, int]] = []
        checkpoints: list[tuple[float, int, list[str]]] = []  # at rest: no session, no scrape in flight

        def checkpoint() -> None:
            quiet.set()
            try:
                wait_for(lambda: all(event.is_set() for event in parked.values()), 60, "the loops to park")
                wait_for(lambda: agent.client.sessions() == [], 10, "sessions to end for a checkpoint")
                # The listing's own connection closes just after its answer: give fds a moment to match.
                with contextlib.suppress(TimeoutError):
                    wait_for(lambda: fd_targets(agent.pid) == idle_fds, 5, "fds back to idle")
                checkpoints.append((time.monotonic() - started, rss_bytes(agent.pid), fd_targets(agent.pid)))
            finally:
                quiet.clear()

        started = time.monotonic()
        next_checkpoint = SOAK_SECONDS / 5
        try:
            while time.monotonic() - started < SOAK_SECONDS and not stop.is_set():
                samples.append((time.monotonic() - started, rss_bytes(agent.pid), fd_count(agent.pid)))
                if time.monotonic() - started >= next_checkpoint:
                    checkpoint()
                    next_checkpoint += SOAK_SECONDS / 5
                stop.wait(2)
            checkpoint()
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
            churn.close()
        assert not errors, errors

        # Exact under load: the storm's namespace counted every refused datagram.
        series = {"reason": "NETFILTER_DROP", "netns": str(pair.a.inode)}
        assert agent.metric("netsleuth_drops_total", **series) == refused_total[0]
        # The namespaces that came and went were retired: their groups left the kernel map.
        assert namespaces_made[0] > 10
        wait_for(
            lambda: (agent.metric("netsleuth_drop_groups") or 0) < 64, 10, "vanished namespaces to be retired"
        )
        ended = {
            dict(labels)["reason"]
            for (name, labels), value in agent.metrics().items()
            if name == "netsleuth_sessions_total" and value
        }
        assert {"max_events", "client_gone"} <= ended, ended

    # RSS is a sawtooth while sessions come and go (the shared symbol table, ring buffers): a leak shows at
    # rest, where every checkpoint after the first must find the same memory and exactly the same fds.
    report = (
        f"{len(samples)} samples over {SOAK_SECONDS:.0f} s, {refused_total[0]} storm drops, "
        f"{namespaces_made[0]} namespaces, {cut_streams[0]} streams cut; RSS at rest (MiB): "
        + ", ".join(f"{rss >> 20} @{elapsed:.0f}s" for elapsed, rss, _ in checkpoints)
        + f"; peak {max(rss for _, rss, _ in samples) >> 20} MiB under load; fds idle {len(idle_fds)}, "
        + f"at rest {[len(fds) for _, _, fds in checkpoints]}, "
        + f"max under load {max(fds for _, _, fds in samples)}"
    )
    print(report)
    assert len(checkpoints) >= 5, report
    rest = [rss for _, rss, _ in checkpoints[1:]]
    assert rest[-1] - rest[0] < 8 << 20 and max(rest) - rest[0] < 12 << 20, report
    assert max(rss for _, rss, _ in samples) < 200 << 20, report  # well inside the unit's MemoryMax=256M

    # Every file, map, program and link at rest is the idle agent's, exactly. Sockets may differ by the one
    # the agent opens for a moment while it works (25 or 26 at rest, not growing, over 130 namespaces and
    # 26 M drops in CI): a leak grows with the work, so more than one extra socket fails.
    def split(fds: list[str]) -> tuple[list[str], int]:
        return [fd for fd in fds if fd != "socket"], fds.count("socket")

    idle_others, idle_sockets = split(idle_fds)
    for _, _, fds in checkpoints:
        others, sockets = split(fds)
        assert others == idle_others and sockets <= idle_sockets + 1, (
            f"{report}\nidle fds {idle_fds}\nnow {fds}"
        )
