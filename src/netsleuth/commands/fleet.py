"""`netsleuth fleet`: the controller's client. `hosts`, `run` (one diagnostic on many hosts at once, the
merged timeline streamed live, then the per-hop verdicts), `sessions`, `show`, `cancel`, `audit`.

The token comes from --token-file or $NETSLEUTH_TOKEN, the controller from --controller or
$NETSLEUTH_CONTROLLER. The controller's one-sentence errors are passed on as they are, with exit code 2 for a
refused request and 1 when the controller cannot be reached; `run` exits 1 when the result is partial.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from netsleuth.commands import Command
from netsleuth.errors import EXIT_ENVIRONMENT, EnvironmentProblem, UsageError

__all__ = ["COMMAND", "filters_to_config", "sse_events"]

DEFAULT_CONTROLLER = "http://127.0.0.1:8477"
_FOLLOW_AGAIN = 30  # reconnections of a lost event stream, ...
_FOLLOW_AGAIN_WAIT_S = 1.0  # ... this far apart: a session is taken over within a lease (10 s) of its loss
_RUN_DIAGNOSTICS = ("drops", "resets", "conn", "diagnose", "tcp.life", "tcp.states", "tcp.retrans",
                    "tcp.connlat", "tcp.queues")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controller",
        metavar="URL[,URL]",
        help=f"one controller, a balancer in front of several, or several (default: $NETSLEUTH_CONTROLLER or "
        f"{DEFAULT_CONTROLLER})",
    )
    parser.add_argument("--token-file", metavar="FILE", help="the API token (default: $NETSLEUTH_TOKEN)")
    actions = parser.add_subparsers(dest="fleet_action", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    hosts = actions.add_parser("hosts", help="the hosts you may diagnose, with their state")
    hosts.add_argument("--json", action="store_true", help="one JSON object per host")
    run = actions.add_parser("run", help="one diagnostic on several hosts at the same moment")
    run.add_argument("diagnostic", choices=_RUN_DIAGNOSTICS)
    target = run.add_mutually_exclusive_group(required=True)
    target.add_argument("--hosts", metavar="A,B,C", help="host ids, comma separated")
    target.add_argument(
        "--selector", metavar="KEY=VALUE", action="append", help="hosts by label (repeatable: all must hold)"
    )
    target.add_argument("--all-hosts", action="store_true", help="every registered host you may use")
    target.add_argument("--hosts-with-netns", metavar="NS", help="the hosts holding network namespace NS")
    target.add_argument("--hosts-with-pod", metavar="NAMESPACE/NAME", help="the hosts holding this pod")
    target.add_argument(
        "--hosts-with-k8s-namespace", metavar="NS", help="the hosts holding pods of Kubernetes namespace NS"
    )
    run.add_argument("--duration", type=float, required=True, metavar="S", help="seconds to watch")
    run.add_argument("--json", action="store_true", help="the merged stream as JSON lines")
    run.add_argument(
        "--reason", action="append", default=[], help="drops: only this drop reason (repeatable)"
    )
    from netsleuth.diagnostics.filters import add_filter_arguments

    add_filter_arguments(run)
    sessions = actions.add_parser("sessions", help="your sessions (admins: everyone's), newest first")
    sessions.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="one session: hosts, verdicts (and --json: the merged timeline)")
    show.add_argument("session")
    show.add_argument("--json", action="store_true")
    cancel = actions.add_parser("cancel", help="stop a running session on every host")
    cancel.add_argument("session")
    audit = actions.add_parser("audit", help="the audit trail (admins only)")
    audit.add_argument("--user")
    audit.add_argument("--decision", choices=("allow", "deny"))
    audit.add_argument("--since", help="ISO time or unix seconds")
    audit.add_argument("--limit", type=int, default=200)
    audit.add_argument("--json", action="store_true")


# -- talking to the controller -----------------------------------------------------------------------------
def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as error:
            raise UsageError(f"cannot read --token-file {args.token_file}: {error.strerror}") from error
    else:
        token = os.environ.get("NETSLEUTH_TOKEN", "").strip()
    if not token:
        raise UsageError("no API token: give --token-file FILE or set NETSLEUTH_TOKEN")
    return token


class _Client:
    """The controller, or several of them (`--controller URL,URL`, or one balancer's URL): a request that
    cannot reach one goes to the next; `fleet run` follows its session again wherever it can."""

    def __init__(self, args: argparse.Namespace) -> None:
        import httpx

        self._httpx = httpx
        text = args.controller or os.environ.get("NETSLEUTH_CONTROLLER") or DEFAULT_CONTROLLER
        self.bases = [url.strip().rstrip("/") for url in text.split(",") if url.strip()]
        for base in self.bases or [text]:
            if not base.startswith(("http://", "https://")):
                raise UsageError(f"--controller {base!r} must be an http:// or https:// URL")
        self._current = 0
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {_token(args)}"},
            timeout=httpx.Timeout(15.0, read=None),
        )

    @property
    def base(self) -> str:
        return self.bases[self._current]

    def next_controller(self) -> None:
        """The next of several controllers (with one, or a balancer: the same, again)."""
        self._current = (self._current + 1) % len(self.bases)

    def _check(self, response: Any) -> Any:
        if response.status_code < 400:
            return response
        try:
            message = response.json().get("error") or response.text
        except ValueError:
            message = response.text.strip() or f"HTTP {response.status_code}"
        message = str(message).rstrip(".")
        if response.status_code >= 500:
            raise EnvironmentProblem(f"the controller failed: {message}")
        raise UsageError(f"{message} (HTTP {response.status_code})")

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        # Each controller once. A request that never reached one (refused connection) is safe to send to
        # the next; a GET that got no answer too; a POST that may have arrived is not sent twice.
        for attempt in range(len(self.bases)):
            try:
                return self._check(self._client.request(method, self.base + path, **kwargs))
            except self._httpx.TransportError as error:
                again = isinstance(error, self._httpx.ConnectError) or method == "GET"
                if attempt + 1 == len(self.bases) or not again:
                    where = self.base
                    raise EnvironmentProblem(f"cannot reach the controller at {where}: {error}") from error
                self.next_controller()
        raise AssertionError("unreachable")

    def stream_events(self, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        try:
            with self._client.stream("GET", self.base + path) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                yield from sse_events(response.iter_lines())
        except self._httpx.TransportError as error:
            raise EnvironmentProblem(f"lost the controller at {self.base}: {error}") from error


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """text/event-stream lines -> (event, JSON data); comments (keepalives) are skipped."""
    name, data = "message", list[str]()
    for line in lines:
        if line == "":
            if data:
                with contextlib.suppress(ValueError):
                    yield name, json.loads("\n".join(data))
            name, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def filters_to_config(args: argparse.Namespace) -> dict[str, Any]:
    from netsleuth.diagnostics.filters import FILTER_KEYS

    config: dict[str, Any] = {}
    for key in FILTER_KEYS:
        value = getattr(args, key, None)
        if value not in (None, [], ""):
            config[key] = value
    if args.reason:
        config["reason"] = args.reason
    return config


# -- output ------------------------------------------------------------------------------------------------
def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _offset_text(offset_ns: object) -> str:
    return f"{offset_ns / 1e6:+.3f} ms" if isinstance(offset_ns, int) else "-"


def _host_line(host: str, view: dict[str, Any]) -> str:
    totals = view.get("totals") or {}
    total = totals.get("total", totals.get("matched", "-"))
    reason = f" ({view['reason']})" if view.get("reason") else ""
    skew = view.get("start_skew_ns")
    start = f"  start {skew / 1e6:+.3f} ms" if isinstance(skew, int) else ""
    return (
        f"  {host:<16} {view.get('state', '?'):<9} offset {_offset_text(view.get('offset_ns'))}{start}  "
        f"events {total}  lost {view.get('lost', 0)}  sampled {view.get('sampled', 0)}  "
        f"records {view.get('records', 0)}{reason}"
    )


def _totals_of(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The exact totals a summary holds (EventTotals.to_json): at its top (drops, resets, tcp), under `drops`
    (diagnose, conn) and per event kind under `events` (conn)."""
    found = [entry] if isinstance(entry.get("total"), int) else []
    if isinstance(entry.get("drops"), dict):
        found.append(entry["drops"])
    events = entry.get("events")
    if isinstance(events, dict):
        found.extend(value for value in events.values() if isinstance(value, dict))
    return [totals for totals in found if isinstance(totals.get("total"), int)]


def _summary_text(entry: dict[str, Any]) -> str:
    """A host's summary line, whatever the diagnostic: what it found (connections by outcome, verdicts),
    then its exact totals summed over the kinds it counts."""
    found = []
    if isinstance(entry.get("connections"), int):
        outcomes = entry.get("outcomes") or {}
        detail = ", ".join(f"{name} {count}" for name, count in sorted(outcomes.items()))
        found.append(f"connections {entry['connections']}" + (f" ({detail})" if detail else ""))
    if isinstance(entry.get("verdicts"), int):
        found.append(f"verdicts {entry['verdicts']}")
    totals = _totals_of(entry)
    if totals:
        sums = {key: sum(int(t.get(key) or 0) for t in totals) for key in ("total", "lost", "sampled")}
        found.append("total {total}  lost {lost}  sampled {sampled}".format(**sums))
    return "  ".join(found) or "no totals"


def _record_line(entry: dict[str, Any]) -> str:
    time_text = str(entry.get("time", ""))[11:26]
    kind = entry.get("type", "?")
    if kind == "conn_event":
        what = f"{entry.get('event')}: {entry.get('text', '')}"
    elif kind == "conntrack":
        orig, reply = entry.get("orig") or {}, entry.get("reply") or {}
        states = " → ".join(str(s.get("state")) for s in entry.get("states") or [] if isinstance(s, dict))
        life = f"  {states}" if states else f"  {entry.get('state') or ''}"
        if "created" in entry and entry.get("created") is None:
            life += " (older than the session)"
        if entry.get("destroyed"):
            life += f", destroyed {str(entry['destroyed'])[11:26]}"
        what = (
            f"orig {orig.get('src')}:{orig.get('sport')} > {orig.get('dst')}:{orig.get('dport')}  reply "
            f"{reply.get('src')}:{reply.get('sport')} > {reply.get('dst')}:{reply.get('dport')}{life}"
        )
    elif kind == "conntrack_stats":
        liberal = entry.get("be_liberal")
        what = f"netns {entry.get('netns')}: {entry.get('invalid')} packet(s) conntrack found INVALID" + (
            f" (nf_conntrack_tcp_be_liberal={liberal})" if liberal is not None else ""
        )
    elif kind == "drop":
        netfilter = entry.get("netfilter") or {}
        rule = f'  rule "{netfilter["rule"]}"' if netfilter.get("rule") else ""
        what = f"{entry.get('reason')} {entry.get('tcp_flags') or ''} at {entry.get('location')}{rule}"
    elif kind == "summary":
        what = _summary_text(entry)
    elif kind == "conn":
        what = f"{entry.get('outcome')}: {entry.get('verdict')}"
    else:
        what = str(
            entry.get("text") or entry.get("cause") or entry.get("new_state") or entry.get("reason") or ""
        )
    flow = f"  {entry['flow']}" if entry.get("flow") else ""
    return f"{time_text}  {entry.get('host', '?'):<12} {kind:<10}{flow}  {what}".rstrip()


def _verdict_lines(verdict: dict[str, Any]) -> list[str]:
    """A merged verdict: its first line (what the application saw, where it began, the cause), then its hops
    in causal order - `*` where it began, `~` a hop the clocks cannot order against the one before - then the
    fixes."""
    lines = [f"VERDICT {verdict.get('outcome')}: {verdict.get('text')}"]
    for number, hop in enumerate(verdict.get("hops") or [], start=1):
        if not isinstance(hop, dict):
            continue
        mark = "*" if hop.get("began") else "~" if hop.get("order") == "concurrent" else " "
        off = (verdict.get("clocks_ms") or {}).get(hop.get("host"))
        when = str(hop.get("time"))[11:26] + (f" ±{off:g} ms" if off else "") if hop.get("time") else "before"
        unknown = (
            f"  (order against hop {number - 1} unknown: clocks ±{hop['uncertainty_ms']} ms)"
            if hop.get("order") == "concurrent"
            else ""
        )
        lines.append(f"  {mark}{number:>2}. {when:<26}  {hop.get('detail')}{unknown}")
    lines.extend(f"  fix: {fix}" for fix in verdict.get("fix") or [])
    return lines


def _print_end(session: dict[str, Any]) -> None:
    spread = session.get("start_spread_ms")
    spread_text = f"; all hosts started within {spread:.3f} ms" if isinstance(spread, int | float) else ""
    partial = " PARTIAL" if session.get("partial") else ""
    _out(f"session {session.get('id')} {session.get('state')}{partial}{spread_text}")
    for host, view in (session.get("hosts") or {}).items():
        _out(_host_line(host, view))


def _lost(error: EnvironmentProblem, session_id: str) -> EnvironmentProblem:
    """The controller went away during a session: the sentence names the session, which the agents finish
    on their own, so the user can look it up once the controller is back."""
    return EnvironmentProblem(
        f"{str(error).rstrip('.')}; session {session_id} goes on on its hosts until its deadline: "
        f"`netsleuth fleet show {session_id}` once the controller answers again"
    )


def _events_of(client: _Client, session_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The session's events; when the stream is lost (the controller died, a balancer dropped it) it is
    followed again - through the next controller, or the balancer - a bounded number of times: any
    controller answers for any session, and another takes it over when the one running it dies. Each
    time, the controller first sends the whole session again (`session`)."""
    for attempt in range(_FOLLOW_AGAIN + 1):
        try:
            yield from client.stream_events(f"/api/v1/sessions/{session_id}/events")
            return
        except EnvironmentProblem as error:
            if attempt == _FOLLOW_AGAIN:
                raise _lost(error, session_id) from error
            sys.stderr.write(f"netsleuth: {str(error).rstrip('.')}; following session {session_id} again\n")
            time.sleep(_FOLLOW_AGAIN_WAIT_S)
            client.next_controller()


def _session_after_stream(client: _Client, session_id: str) -> dict[str, Any]:
    try:
        session: dict[str, Any] = client.request("GET", f"/api/v1/sessions/{session_id}").json()
    except EnvironmentProblem as error:
        raise _lost(error, session_id) from error
    return session


def _selector(args: argparse.Namespace) -> dict[str, Any]:
    if args.all_hosts:
        return {"all": True}
    if args.hosts_with_netns:
        return {"netns": args.hosts_with_netns}
    if args.hosts_with_pod:
        return {"pod": args.hosts_with_pod}
    if args.hosts_with_k8s_namespace:
        return {"k8s_namespace": args.hosts_with_k8s_namespace}
    labels = {}
    for pair in args.selector:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UsageError(f"--selector {pair!r} must be KEY=VALUE")
        labels[key] = value
    return {"labels": labels}


def _run(args: argparse.Namespace, client: _Client) -> int:
    if not 0 < args.duration <= 86400:
        raise UsageError("--duration must be from 0 to 86400 seconds")
    body: dict[str, Any] = {
        "diagnostic": args.diagnostic,
        "config": filters_to_config(args),
        "duration": args.duration,
    }
    if args.hosts:
        hosts = [host.strip() for host in args.hosts.split(",") if host.strip()]
        if not hosts:
            raise UsageError("--hosts names no host")
        body["hosts"] = hosts
    else:
        # A selector: how a fleet-sized session is asked for (a list of its hosts would be too big).
        body["selector"] = _selector(args)
    created = client.request("POST", "/api/v1/sessions", json=body).json()
    session_id = created["id"]
    if args.json:
        # First, so a reader that loses the stream (or is interrupted) can still look the session up.
        _out(json.dumps({"type": "session", "id": session_id, "diagnostic": args.diagnostic,
                         "hosts": list(created.get("hosts", {})), "duration": args.duration}))  # fmt: skip
    else:
        names = list(created.get("hosts", {}))
        on = ", ".join(names) if len(names) <= 20 else f"{len(names)} hosts ({', '.join(names[:5])}, ...)"
        _out(f"session {session_id}: {args.diagnostic} on {on} for {args.duration:g} s")
    final: dict[str, Any] = {}
    printed: set[str] = set()  # records, once each: a stream followed again starts with the whole session

    def record(entry: dict[str, Any]) -> None:
        key = json.dumps(entry, sort_keys=True)
        if key not in printed:
            printed.add(key)
            _out(json.dumps(entry) if args.json else _record_line(entry))

    try:
        for name, data in _events_of(client, session_id):
            if name == "session":
                for entry in data.get("timeline") or []:
                    record(entry)
            elif name == "record":
                record(data)
            elif args.json:
                _out(json.dumps(data if name == "verdict" else {"type": name, **data}))
            elif name == "status":
                reason = f" ({data['reason']})" if data.get("reason") else ""
                _out(
                    f"# {data.get('host')}: {data.get('state')}{reason}  "
                    f"offset {_offset_text(data.get('offset_ns'))}"
                )
            elif name == "verdict":
                for line in _verdict_lines(data):
                    _out(line)
            if name == "end":
                final = data
                break
    except KeyboardInterrupt:
        with contextlib.suppress(UsageError, EnvironmentProblem):
            client.request("POST", f"/api/v1/sessions/{session_id}/cancel")
        sys.stderr.write(f"netsleuth: session {session_id} cancelled\n")
        return 130
    session = _session_after_stream(client, session_id)
    if not args.json:
        _print_end(session)
    state = session.get("state", final.get("state"))
    return EXIT_ENVIRONMENT if session.get("partial") or state != "ended" else 0


def _hosts(args: argparse.Namespace, client: _Client) -> int:
    hosts = client.request("GET", "/api/v1/hosts").json()
    for host in hosts:
        if args.json:
            _out(json.dumps(host))
            continue
        namespaces = ",".join(
            str(ns.get("name")) for ns in host.get("namespaces", []) if isinstance(ns, dict)
        )
        labels = ",".join(f"{k}={v}" for k, v in (host.get("labels") or {}).items())
        error = f"  last error: {host['last_error']}" if host.get("last_error") else ""
        _out(
            f"{host.get('host', '?'):<16} {host.get('state', '?'):<6} {host.get('hostname', '')}  "
            f"kernel {host.get('kernel', '?')}  netsleuth {host.get('version', '?')}  "
            f"netns {namespaces or '-'}  labels {labels or '-'}{error}"
        )
    if not hosts and not args.json:
        _out("no hosts you may diagnose have registered")
    return 0


def _sessions(args: argparse.Namespace, client: _Client) -> int:
    for session in client.request("GET", "/api/v1/sessions").json():
        if args.json:
            _out(json.dumps(session))
            continue
        partial = " partial" if session.get("partial") else ""
        _out(
            f"{session.get('id')}  {session.get('created', '')[:19]}  {session.get('user'):<10} "
            f"{session.get('diagnostic'):<9} {session.get('state')}{partial}  "
            f"hosts {','.join(session.get('hosts', {}))}"
        )
    return 0


def _show(args: argparse.Namespace, client: _Client) -> int:
    session = client.request("GET", f"/api/v1/sessions/{args.session}").json()
    if args.json:
        _out(json.dumps(session))
        return 0
    _print_end(session)
    for verdict in session.get("verdicts", []):
        for line in _verdict_lines(verdict):
            _out(line)
    return 0


def _audit(args: argparse.Namespace, client: _Client) -> int:
    params = {k: v for k, v in (("user", args.user), ("decision", args.decision), ("since", args.since)) if v}
    params["limit"] = str(args.limit)
    for record in client.request("GET", "/api/v1/audit", params=params).json():
        if args.json:
            _out(json.dumps(record))
            continue
        who = record.get("user") or record.get("host") or "-"
        what = " ".join(str(x) for x in (record.get("diagnostic"), ",".join(record.get("hosts") or [])) if x)
        reason = f"  {record['reason']}" if record.get("reason") else ""
        outcome = f"  -> {record['outcome']}" if record.get("outcome") else ""
        # Who wrote it is the subject it was stored under (controller/audit.py), whatever its body claims.
        writer = (
            f"agent {record.get('host')}" if record.get("source") == "agent" else str(record.get("source"))
        )
        claimed = record.get("claimed")
        claim = f"  (claimed {', '.join(f'{k} {v}' for k, v in claimed.items())})" if claimed else ""
        _out(
            f"{str(record.get('time', ''))[:23]}  #{record.get('seq')}  by {writer:<13} {who:<10} "
            f"{record.get('action'):<15} {record.get('decision'):<5} {what}{reason}{outcome}{claim}"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    from netsleuth.extras import require_extra

    require_extra("fleet", "netsleuth fleet")
    client = _Client(args)
    handlers = {"run": _run, "hosts": _hosts, "sessions": _sessions, "show": _show, "audit": _audit}
    if args.fleet_action == "cancel":
        session = client.request("POST", f"/api/v1/sessions/{args.session}/cancel").json()
        _out(f"session {session.get('id')}: cancel sent to {', '.join(session.get('hosts', {}))}")
        return 0
    return handlers[args.fleet_action](args, client)


COMMAND = Command(
    name="fleet",
    help="run one diagnosis on many hosts through the controller: hosts, run, sessions, show, cancel, audit",
    add_arguments=add_arguments,
    run=run,
)
