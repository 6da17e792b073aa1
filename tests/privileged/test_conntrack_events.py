"""Conntrack's events and INVALID counter read over ctnetlink, against the real kernel in a namespace: a
REDIRECT's NEW is stamped when the connection is made (not later), its UPDATEs follow, an entry killed by a
RST sends its DESTROY, the INVALID count rises for a segment conntrack refuses, and the stamping helper
process is gone after close."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator

import pytest

from netsleuth.kernel.conntrack import ConntrackReader, list_namespaces
from netsleuth.kernel.conntrack_events import ConntrackEvent, ConntrackEvents
from netsleuth.kernel.netns import NetnsNames
from tests.netlab import Host, lab, wait_for

pytestmark = pytest.mark.privileged

# In the namespace: a listener on 7001, where `--dport 7000` is REDIRECTed; nothing on 7003 (<- 7002).
_CONNECT = (
    "import json,socket,sys,time\n"
    "s=socket.socket();s.bind(('127.0.0.1',7001));s.listen()\n"
    "before=time.time_ns()\n"
    "c=socket.create_connection(('127.0.0.1',7000));after=time.time_ns()\n"
    "port=c.getsockname()[1];s.accept()[0].close();c.close()\n"
    "r=socket.socket()\n"
    "try: r.connect(('127.0.0.1',7002))\n"
    "except OSError: pass\n"
    "print(json.dumps({'before':before,'after':after,'port':port,'refused':r.getsockname()[1]}))\n"
)
# A TCP segment with SYN and RST set: a flag combination conntrack refuses (tcp_error, tcp_valid_flags).
_INVALID = (
    "import socket,struct\n"
    "tcp=struct.pack('!HHIIBBHHH',40000,7001,1,0,5<<4,0x06,512,0,0)\n"
    "raw=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP);raw.sendto(tcp,('127.0.0.1',0))\n"
)


@pytest.fixture
def host() -> Iterator[Host]:
    with lab() as made:
        ns = made.host("ct")
        for port in ("7000", "7002"):
            target = str(int(port) + 1)
            ns.run("iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", port, "-j", "REDIRECT",
                   "--to-ports", target)  # fmt: skip
        yield ns


def _events(host: Host) -> ConntrackEvents:
    return ConntrackEvents(list_namespaces(NetnsNames(), [host.name]))


def test_a_redirects_events_are_stamped_when_they_happen(host: Host) -> None:
    with _events(host) as events:
        events.start()
        made = json.loads(host.run("python3", "-c", _CONNECT).stdout)
        seen: list[ConntrackEvent] = []

        def destroyed() -> bool:
            seen.extend(events.take())
            return any(e.kind == "destroy" and e.entry.original.src[1] == made["refused"] for e in seen)

        wait_for(destroyed, 10, "the refused connection's DESTROY")
    assert events.problems == [] and events.lost == 0
    ours = [e for e in seen if e.entry.original.src[1] == made["port"]]
    new = [e for e in ours if e.kind == "new"]
    assert len(new) == 1
    entry = new[0].entry
    assert (
        entry.redirect
        and entry.original.dst == ("127.0.0.1", 7000)
        and entry.reply.src == ("127.0.0.1", 7001)
    )
    assert entry.where == f"netns {host.name}"
    # Not before the connect() began; late only by the helper's wake-up (generously bounded here: a busy CI).
    assert made["before"] <= new[0].wall_ns <= made["after"] + 500_000_000, new[0].wall_ns - made["before"]
    updates = [e.entry.state for e in ours if e.kind == "update"]
    assert "ESTABLISHED" in updates, updates
    stamps = [e.wall_ns for e in ours]
    assert stamps == sorted(stamps)
    # The connection refused through its REDIRECT: the RST killed the SYN_SENT entry, which said so.
    refused = [e.kind for e in seen if e.entry.original.src[1] == made["refused"]]
    assert refused[0] == "new" and refused[-1] == "destroy", refused


def test_the_invalid_counter_counts_what_conntrack_refused(host: Host) -> None:
    with ConntrackReader(proto=None, namespaces=[host.name], watch_destroyed=False) as reader:
        where = f"netns {host.name}"
        host.run("python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 7000), timeout=1)",
                 check=False)  # fmt: skip  # conntrack is up in the namespace (the REDIRECT)
        before = reader.invalid_counts()[where]
        host.run("python3", "-c", _INVALID)
        host.run("python3", "-c", _INVALID)
        after = reader.invalid_counts()[where]
        proc = host.run("cat", "/proc/net/stat/nf_conntrack").stdout.splitlines()
    # Two segments, each judged twice on loopback: leaving (OUTPUT) and arriving again (PREROUTING).
    assert after - before == 4, (before, after)
    # The same number /proc shows (the `invalid` column, one hex line per CPU).
    column = proc[0].split().index("invalid")
    assert after == sum(int(line.split()[column], 16) for line in proc[1:])


def test_the_helper_is_gone_after_close(host: Host) -> None:
    events = _events(host)
    events.start()
    helper = events._helper
    assert helper is not None and helper.poll() is None
    pid = helper.pid
    events.close()
    assert helper.poll() is not None
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{pid}")


def test_where_conntrack_keeps_its_own_timestamps_a_nat_is_timed_exactly(host: Host) -> None:
    """With net.netfilter.nf_conntrack_timestamp=1 in the namespace (the operator's choice: netsleuth never
    turns it on) the kernel's creation time of the entry is the NAT hop's time: inside the connect() call."""
    from netsleuth.fleet.conntrack_records import ConntrackWatch
    from netsleuth.fleet.merge import parse_time_ns

    host.run("sysctl", "-qw", "net.netfilter.nf_conntrack_timestamp=1")  # per namespace: gone with it
    watch = ConntrackWatch({"proto": "tcp", "dport": 7000}, [host.name])
    try:
        watch.start()
        t0 = time.time_ns()
        watch.mark()
        made = json.loads(host.run("python3", "-c", _CONNECT).stdout)
        records, notes = watch.finish(t0, time.time_ns())
    finally:
        watch.close()
    [record] = [r for r in records if r["type"] == "conntrack" and r["orig"]["sport"] == made["port"]]
    created = parse_time_ns(record["created"])
    assert created is not None and made["before"] <= created <= made["after"], created - made["before"]
    assert record["time"] == record["created"] and record["reply"]["sport"] == 7001
    assert notes == []
