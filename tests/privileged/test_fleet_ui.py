"""The web UI in a real browser (Debian's headless Chromium) against the real stack: nats-server, one real
agent per host in the namespace testbed (client -> lb with nftables DNAT -> server whose firewall drops
port 8080), and a real `netsleuth controller` process serving the page and its API.

The tests click and type like a person (labels, roles and button names, so they also check that every
control is labelled), and compare what the page shows with what the API says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.sync_api import Browser, Page, expect

from tests.controller_lab import ControllerProcess
from tests.fleet_lab import STORY_VIP_PORT, VIP, FleetLab, invalid_ack, serve_story
from tests.netlab import wait_for
from tests.privileged.test_agent_capabilities import setpriv_prefix, unit_capabilities
from tests.ui_browser import BrowserPage, browser, open_page, sign_in

pytestmark = pytest.mark.privileged

HOSTS = ("client", "lb", "server")
RULE = "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"
SERVICE_PORT = 80  # the VIP's port; the lb DNATs it to server:8080, where the firewall drops it
NARROW_USER = "carol"
ENDED_AT = r"Ended at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"  # the page's UTC time of the session's end
OIDC_ISSUER = "https://idp.example"
OIDC_AUDIENCE = "netsleuth"


@dataclass
class UiStack:
    lab: FleetLab
    controller: ControllerProcess
    browser: Browser
    shots: Path
    hosts: tuple[str, ...] = HOSTS
    service_port: int = SERVICE_PORT
    journal: dict[str, Any] = field(default_factory=dict)  # what earlier tests made (sessions, refusals)
    pages: list[BrowserPage] = field(default_factory=list)
    oidc_key: Ed25519PrivateKey | None = None

    def oidc_token(self, email: str, groups: list[str], minutes: float = 5) -> str:
        """An ID token as the identity provider would sign it (the controller trusts its JWKS file)."""
        assert self.oidc_key is not None
        now = datetime.datetime.now(datetime.UTC)
        claims = {"iss": OIDC_ISSUER, "aud": OIDC_AUDIENCE, "email": email, "groups": groups,
                  "iat": now, "exp": now + datetime.timedelta(minutes=minutes)}  # fmt: skip
        return jwt.encode(claims, self.oidc_key, algorithm="EdDSA", headers={"kid": "idp-1"})

    @property
    def base_url(self) -> str:
        return self.controller.url

    @property
    def admin_token(self) -> str:
        return self.controller.tokens["root"]

    def page(self, user: str, width: int = 1280, height: int = 900) -> BrowserPage:
        opened = open_page(self.browser, self.base_url, width, height)
        self.pages.append(opened)
        sign_in(opened.page, self.controller.tokens[user])
        return opened

    def api(self, user: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.controller.tokens[user]}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=20)

    def drive_traffic(self, seconds: float = 1.0) -> None:
        """SYNs from the client to the VIP: DNATed by lb, dropped by the server's firewall rule."""
        code = (
            "import socket\n"
            f"s = socket.socket(); s.settimeout({max(0.5, seconds)})\n"
            f"try:\n    s.connect(('{VIP}', {self.service_port}))\nexcept OSError as e:\n    print(e)\n"
        )
        self.lab.hosts["client"].run("python3", "-c", code, check=False)

    def shot(self, page: Page, name: str, full_page: bool = True, selector: str | None = None) -> None:
        path = str(self.shots / f"{name}.png")
        if selector is not None:
            page.locator(selector).screenshot(path=path)
        else:
            page.screenshot(path=path, full_page=full_page)


@contextlib.contextmanager
def fleet_ui_stack() -> Iterator[UiStack]:
    """The whole stack, torn down in reverse whatever happens. Screenshots go to $NETSLEUTH_UI_SCREENSHOTS
    (docs/img when the docs are refreshed) or a temporary directory."""
    target = os.environ.get("NETSLEUTH_UI_SCREENSHOTS")
    shots = Path(target) if target else Path(tempfile.mkdtemp(prefix="netsleuth-ui-shots-"))
    shots.mkdir(parents=True, exist_ok=True)
    try:
        with FleetLab(hosts=HOSTS) as lab:
            serve_story(lab)  # the seed-001 story's application and sidecar on the server
            client_netns = lab.hosts["client"].netns
            # A narrow role: only `drops`, only hosts client and lb, only the client's namespace.
            narrow = (
                "[roles.narrow]\n"
                'diagnostics = ["drops"]\n'
                'hosts = ["client", "lb"]\n'
                f'netns = ["{client_netns}"]\n'
                "max_concurrent = 1\n"
                "max_duration = 10\n"
            )
            # OIDC: the identity provider's public key in a JWKS file; its "groups" claim names the roles.
            oidc_key = Ed25519PrivateKey.generate()
            jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(oidc_key.public_key()))
            jwks = lab.workdir / "jwks.json"
            jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "idp-1", "alg": "EdDSA", "use": "sig"}]}))
            oidc = (
                f'[oidc]\njwks_file = "{jwks}"\nissuer = "{OIDC_ISSUER}"\naudience = "{OIDC_AUDIENCE}"\n'
                'user_claim = "email"\nroles_claim = "groups"\n'
            )
            users = {NARROW_USER: ["narrow"]}
            with (
                ControllerProcess(lab, extra_config=narrow + oidc, extra_users=users) as controller,
                browser() as instance,
            ):
                stack = UiStack(lab, controller, instance, shots, oidc_key=oidc_key)
                try:
                    yield stack
                finally:
                    for opened in stack.pages:
                        with contextlib.suppress(Exception):
                            opened.context.close()
    finally:
        if not target:
            shutil.rmtree(shots, ignore_errors=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[UiStack]:
    with fleet_ui_stack() as made:
        yield made


def session_id(page: Page) -> str:
    """The id once the page moved to the session; the form's error sentence if the server refused."""
    error = page.locator(".form-error:not([hidden])")
    wait_for(lambda: "#/session/" in page.url or error.count() > 0, 20, "the session page")
    assert "#/session/" in page.url, f"the session was refused: {error.inner_text()}"
    return page.url.split("#/session/")[1]


def start_diagnosis(page: Page, diagnostic: str, duration: int, proto: str = "tcp") -> str:
    """From the hosts page: tick every host, open New diagnosis, fill it in, start; returns the session id."""
    page.goto("/#/hosts")
    expect(page.locator("tbody tr[data-host]")).to_have_count(len(HOSTS), timeout=20_000)  # the first poll
    page.get_by_role("checkbox", name="Select every shown host").check()
    page.get_by_role("button", name="Diagnose selected").click()
    page.get_by_role("heading", name="New diagnosis").wait_for()
    page.get_by_label("Diagnostic").select_option(diagnostic)
    page.get_by_label("Protocol").fill(proto)
    page.get_by_label("Duration (seconds)").fill(str(duration))
    page.get_by_role("button", name="Start diagnosis").click()
    return session_id(page)


def card(page: Page, host: str) -> Any:
    return page.locator(f'.hostcard[data-host="{host}"]')


def all_started(page: Page) -> bool:
    """Every host card is past `preparing`/`ready` (running, or already ended on a busy machine)."""
    shown = set(page.locator(".hostcard").evaluate_all("cards => cards.map(c => c.dataset.state)"))
    return bool(shown) and shown <= {"running", "ended", "failed"}


def wait_cards(page: Page, states: dict[str, str], timeout_s: float) -> None:
    """Until each host's card shows its state; on timeout, say what every card shows (state and reason)."""

    def shown() -> dict[str, str]:
        script = "cs => cs.map(c => [c.dataset.host, c.dataset.state, c.querySelector('p')?.textContent])"
        cards = page.locator(".hostcard").evaluate_all(script)
        return {host: f"{state} {reason or ''}".strip() for host, state, reason in cards}

    def reached() -> bool:
        now = shown()
        return all(now.get(host, "").split(" ")[0] == state for host, state in states.items())

    try:
        wait_for(reached, timeout_s, f"host cards {states}")
    except TimeoutError:
        raise AssertionError(f"the host cards did not reach {states}: they show {shown()}") from None


def diagnose_session(stack: UiStack) -> str:
    """Sign in, start `diagnose` on the three hosts, send the SYNs once every host runs; the session id."""
    if "diagnose" in stack.journal:
        return str(stack.journal["diagnose"])
    opened = stack.page("alice")
    page = opened.page
    expect(page.locator("tbody tr[data-host]")).to_have_count(len(HOSTS))
    stack.shot(page, "hosts")
    # Every agent stops a session whose BPF programs exceed 5% of a CPU. The programs see every
    # namespace's packets, so another job flooding this machine can trip that budget. Such a run says
    # nothing about the page, and only such a run is tried again (at most twice).
    for attempt in range(3):
        session = start_diagnosis(page, "diagnose", duration=5)
        wait_for(lambda: all_started(page), 60, "all hosts running")
        stack.drive_traffic(1.0)
        stack.drive_traffic(1.0)
        stack.shot(page, "session-live")
        wait_cards(page, dict.fromkeys(HOSTS, "ended"), 60)
        with stack.api("alice") as client:
            body = client.get(f"/api/v1/sessions/{session}").json()
        found = [r for r in body["timeline"] if r.get("type") == "verdict"] + body["verdicts"]
        if any(RULE in json.dumps(v) for v in found):
            break
        budget = [h for h, v in body["hosts"].items() if v["reason"].startswith("cpu_budget")]
        assert budget and attempt < 2, f"the controller has no verdict naming the rule: {body}"
    expect(page.locator(".verdict").filter(has_text=RULE).first).to_be_visible(timeout=20_000)
    page.wait_for_timeout(600)  # the rate chart redraws at most twice a second
    stack.shot(page, "session")
    stack.journal["diagnose"] = session
    stack.journal["diagnose_page"] = opened
    return session


def test_sign_in_diagnose_three_hosts_far_firewall_verdict_and_every_host_ended(stack: UiStack) -> None:
    session = diagnose_session(stack)
    opened: BrowserPage = stack.journal["diagnose_page"]
    page = opened.page
    with stack.api("alice") as client:
        body = client.get(f"/api/v1/sessions/{session}").json()
    assert body["state"] == "ended", body["hosts"]
    # The firewall verdict of the far host names the rule; it is the worst thing found, so it comes first.
    firewall = page.locator('.verdict[data-host="server"][data-category="firewall"]')
    expect(firewall).to_contain_text(f'firewall rule "{RULE}"')
    expect(firewall.locator("pre").first).to_contain_text("iptables -t filter -D INPUT 1")
    expect(page.locator(".verdicts > li").first).to_contain_text(RULE)
    assert any(v.get("category") == "firewall" and RULE in v.get("cause", "") for v in body["timeline"])
    # Every host ended, with the agent's exact totals as the API has them.
    for host in HOSTS:
        expect(card(page, host)).to_have_attribute("data-state", "ended")
        totals = body["hosts"][host]["totals"]
        expect(card(page, host).locator('dd[data-k="total"]')).to_have_text(f"{totals['total']:,}")
        expect(card(page, host).locator('dd[data-k="lost"]')).to_have_text(f"{totals['lost']:,}")
    expect(page.locator(".session-head .badge")).to_have_text("ended")
    expect_ended(page, body)
    # The merged timeline holds the records, grouped per flow on request with one line per hop.
    assert page.locator(".trow").count() > 0
    page.get_by_label("Group by flow (one line per hop)").check()
    expect(page.locator(".trow.group").first).to_be_visible()
    stack.shot(page, "timeline-grouped", selector=".timeline")
    opened.assert_no_errors()


def expect_ended(page: Page, body: dict[str, Any]) -> None:
    """An ended session says that it ended, when, and how many records its hosts sent (the controller's
    count); nothing on it waits for more: no "Follow new records", no "yet"."""
    records = sum(status["records"] for status in body["hosts"].values())
    assert records == body["timeline_length"] > 0, body["hosts"]
    plural = "" if records == 1 else "s"
    expect(page.locator(".ended-note")).to_have_text(
        re.compile(rf"^{ENDED_AT}: {records:,} record{plural} from {len(body['hosts'])} hosts\.$")
    )
    expect(page.get_by_label("Follow new records")).to_be_hidden()
    expect(page.get_by_text("No per-event records yet")).to_have_count(0)


def test_conn_on_three_hosts_shows_the_per_hop_verdict_across_the_dnat(stack: UiStack) -> None:
    """The fleet's own verdicts, merged by the controller from three hosts: the seed-001 story (an ACK out of
    window skips the server's REDIRECT and draws a RST from the application's LISTEN socket) ranked first,
    its hops in the API's causal order, where it began marked, its fixes; the far firewall drop below."""
    opened = stack.page("alice")
    page = opened.page
    seen: dict[str, Any] = {}
    for attempt in range(3):
        session = start_diagnosis(page, "conn", duration=6)
        wait_for(lambda: all_started(page), 90, "all hosts running")
        seen.update(invalid_ack(stack.lab))
        stack.drive_traffic(1.0)
        wait_cards(page, dict.fromkeys(HOSTS, "ended"), 90)
        with stack.api("alice") as client:
            body = client.get(f"/api/v1/sessions/{session}").json()
        story = f"tcp {seen['client']} > {VIP}:{STORY_VIP_PORT}"
        if any(v["flow"] == story for v in body["verdicts"]):
            break
        budget = [h for h, v in body["hosts"].items() if v["reason"].startswith("cpu_budget")]
        assert budget and attempt < 2, f"the controller merged no verdict for the story: {body}"
    verdict = next(v for v in body["verdicts"] if v["flow"] == story)
    assert verdict["outcome"] == "reset"
    first = page.locator(".verdicts > li").first
    expect(first).to_have_attribute("data-outcome", "reset")
    expect(first).to_have_attribute("data-flow", story)
    # The first line, word for word as the API has it: what the application saw, where it began, the cause.
    expect(first.locator(".cause")).to_have_text(verdict["text"])
    # The same hops in the same order, the one where it began marked.
    details = first.locator("ol.hops > li .detail")
    expect(details).to_have_count(len(verdict["hops"]))
    assert details.all_inner_texts() == [hop["detail"] for hop in verdict["hops"]]
    began = first.locator("ol.hops > li.began .detail")
    expect(began).to_have_text(verdict["hops"][verdict["began"]]["detail"])
    expect(began).to_contain_text(
        "skipped REDIRECT → :15006 on host server (conntrack INVALID: out of window)"
    )
    expect(first.locator("pre")).to_have_count(len(verdict["fix"]))
    expect(first.locator("pre").first).to_contain_text("nf_conntrack_tcp_be_liberal=1")
    # The far firewall's drop is there too, with its own hops.
    dropped = next(v for v in body["verdicts"] if v["flow"].endswith(f"> {VIP}:80"))
    shown = page.locator(f'.verdicts > li[data-flow="{dropped["flow"]}"]')
    expect(shown.locator(".cause")).to_have_text(dropped["text"])
    expect(shown).to_contain_text(f'dropped on host server by "{RULE}"')
    stack.shot(page, "session-per-hop-verdict", selector=".verdicts > li:first-child")
    page.get_by_label("Group by flow (one line per hop)").check()
    expect(page.locator(".trow.group").first).to_be_visible()
    stack.shot(page, "timeline-grouped-conn", selector=".timeline")
    opened.assert_no_errors()


def narrow_refusal(stack: UiStack) -> dict[str, Any]:
    if "refused" in stack.journal:
        return dict(stack.journal["refused"])
    # A phone-sized window, signed in with the keyboard only: the token field has the focus, Enter submits.
    opened = open_page(stack.browser, stack.base_url, width=390, height=844)
    stack.pages.append(opened)
    page = opened.page
    page.goto("/")
    expect(page.get_by_label("API token")).to_be_focused()
    page.keyboard.type(stack.controller.tokens[NARROW_USER])
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="Hosts").wait_for()
    client_netns = stack.lab.hosts["client"].netns
    # Only the hosts the role may see, no audit link, and the form offers only what the role allows.
    expect(page.locator("tbody tr[data-host]")).to_have_count(2)
    assert sorted(
        page.locator("tbody tr[data-host]").evaluate_all("rows => rows.map(r => r.dataset.host)")
    ) == [
        "client",
        "lb",
    ]
    expect(page.get_by_role("link", name="Audit")).to_be_hidden()
    stack.shot(page, "hosts-narrow-window")
    page.get_by_role("link", name="New diagnosis").focus()
    page.keyboard.press("Enter")
    page.get_by_role("heading", name="New diagnosis").wait_for()
    diagnostics = page.get_by_label("Diagnostic").locator("option").evaluate_all("o => o.map(x => x.value)")
    namespaces = (
        page.get_by_label("Network namespace").locator("option").evaluate_all("o => o.map(x => x.value)")
    )
    assert diagnostics == ["drops"]
    assert namespaces == [client_netns]
    # What the server refuses comes back as its one sentence, shown next to the form as it is.
    page.get_by_role("checkbox", name="client").check()
    page.get_by_label("Duration (seconds)").fill("600")
    page.get_by_role("button", name="Start diagnosis").click()
    error = page.locator(".form-error:not([hidden])")
    expect(error).to_have_text("Duration (seconds): 600 s is above your maximum of 10 s.")
    expect(page.get_by_label("Duration (seconds)")).to_have_attribute("aria-invalid", "true")
    # Nothing sticks out of the narrow window: the page does not scroll sideways.
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1")
    stack.shot(page, "new-diagnosis-refused-narrow-window")
    # A hand-crafted request for a diagnostic the role lacks, sent from the signed-in page itself.
    crafted = page.evaluate(
        """async (netns) => {
            const headers = {'Content-Type': 'application/json',
                             Authorization: 'Bearer ' + sessionStorage.getItem('netsleuth.token')};
            const request = {hosts: ['client'], diagnostic: 'diagnose', config: {netns}, duration: 3};
            const body = JSON.stringify(request);
            const res = await fetch('/api/v1/sessions', {method: 'POST', headers, body});
            return {status: res.status, body: await res.json()};
        }""",
        client_netns,
    )
    assert crafted["status"] == 403, crafted
    assert "diagnose" in crafted["body"]["error"], crafted
    opened.assert_no_errors()
    stack.journal["refused"] = crafted
    return dict(crafted)


def test_a_narrow_role_sees_only_its_diagnostics_and_namespaces_and_a_crafted_request_is_403_and_audited(
    stack: UiStack,
) -> None:
    narrow_refusal(stack)
    with stack.api("root") as client:
        denied = client.get("/api/v1/audit", params={"user": NARROW_USER, "decision": "deny"}).json()
    crafted = [e for e in denied if e.get("diagnostic") == "diagnose" and e.get("status") == 403]
    assert crafted, denied
    assert crafted[-1]["action"] == "session.create" and crafted[-1]["session"] is None
    # Nothing was dispatched for it: the user has no `diagnose` session.
    with stack.api(NARROW_USER) as client:
        assert [s for s in client.get("/api/v1/sessions").json() if s["diagnostic"] == "diagnose"] == []


def test_a_bad_filter_is_refused_naming_the_forms_field_not_the_clis_flag(stack: UiStack) -> None:
    """The same validation as the CLI: the page sends the filter as typed, the server checks it with the
    diagnostic's own config parser. Its 4xx keeps the CLI's sentence (for the CLI) and names the field apart;
    the page marks that field and words the problem with the field's own label, never `--dport`."""
    client_netns = stack.lab.hosts["client"].netns
    opened = stack.page(NARROW_USER)
    page = opened.page
    page.goto("/#/new")
    page.get_by_role("heading", name="New diagnosis").wait_for()
    page.get_by_role("checkbox", name="client").check()
    page.get_by_label("Destination port").fill("99999")
    page.get_by_role("button", name="Start diagnosis").click()
    error = page.locator(".form-error:not([hidden])")
    wait_for(lambda: "#/session/" in page.url or error.count() > 0, 20, "an answer to the request")
    bad = {"hosts": ["client"], "diagnostic": "drops", "config": {"dport": 99999, "netns": client_netns}}
    assert "#/session/" not in page.url, "the controller accepted --dport 99999; it must refuse it (4xx)"
    with stack.api(NARROW_USER) as client:
        answer = client.post("/api/v1/sessions", json={**bad, "duration": 10})
    assert 400 <= answer.status_code < 500, answer.text
    refusal = answer.json()
    assert refusal["field"] == "dport" and "99999" in refusal["problem"], refusal
    assert "--dport" in refusal["error"]  # the CLI's sentence stays the CLI's
    expect(error).to_have_text(f"Destination port: {refusal['problem']}.")
    assert "--" not in error.inner_text()
    port = page.get_by_label("Destination port")
    expect(port).to_have_attribute("aria-invalid", "true")
    expect(port).to_be_focused()
    stack.shot(page, "new-diagnosis-bad-filter")
    # Mending the field clears the mark.
    port.fill("8080")
    expect(port).not_to_have_attribute("aria-invalid", "true")
    opened.assert_no_errors()


def test_oidc_sign_in_takes_the_roles_from_the_token_and_an_expired_token_gets_the_servers_sentence(
    stack: UiStack,
) -> None:
    opened = open_page(stack.browser, stack.base_url)
    stack.pages.append(opened)
    page = opened.page
    page.goto("/")
    expect(page.get_by_label("API token")).to_be_focused()
    # The controller says whose ID tokens it trusts (GET /api/v1/auth).
    expect(page.get_by_text(f"This controller accepts ID tokens from {OIDC_ISSUER}")).to_be_visible()
    stack.shot(page, "signin")
    expired = stack.oidc_token("dora@example.org", ["narrow"], minutes=-1)
    page.get_by_label("API token").fill(expired)
    page.get_by_role("button", name="Sign in").click()
    error = page.locator(".form-error:not([hidden])")
    expect(error).to_be_visible()
    assert "expired" in error.inner_text()
    page.get_by_label("API token").fill(stack.oidc_token("dora@example.org", ["narrow", "not-a-role"]))
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Hosts").wait_for()
    expect(page.locator("#who")).to_contain_text("dora@example.org")
    expect(page.locator("#who")).to_contain_text("(narrow)")
    expect(page.locator("tbody tr[data-host]")).to_have_count(2)  # the narrow role's hosts: client and lb
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API token")).to_be_visible()
    assert page.evaluate("() => sessionStorage.getItem('netsleuth.token')") is None
    opened.assert_no_errors()


def killed_session(stack: UiStack) -> str:
    if "killed" in stack.journal:
        return str(stack.journal["killed"])
    opened = stack.page("alice")
    page = opened.page
    for attempt in range(3):
        session = start_diagnosis(page, "drops", duration=8)
        wait_for(lambda: all_started(page), 60, "all hosts running")
        if card(page, "server").get_attribute("data-state") == "running":
            break
        # The server's agent stopped on its own before the kill (only the CPU budget, tripped by another
        # job's traffic, may do that here): that run cannot show a kill; try again.
        wait_cards(page, dict.fromkeys(HOSTS, "ended"), 60)
        expect(card(page, "server")).to_contain_text("cpu_budget")
        assert attempt < 2, "three sessions in a row stopped by the CPU budget"
    stack.drive_traffic(0.5)
    try:
        stack.lab.kill_agent("server")
        wait_cards(page, {"server": "failed", "client": "ended", "lb": "ended"}, 60)
        expect(card(page, "server")).to_contain_text("stopped answering")
        expect(page.locator(".session-head .badge")).to_have_text("partial", timeout=20_000)
        stack.shot(page, "session-host-failed")
    finally:
        stack.lab.start_agent("server")
    opened.assert_no_errors()
    stack.journal["killed"] = session
    return session


def test_a_host_killed_mid_session_turns_failed_while_the_others_finish(stack: UiStack) -> None:
    session = killed_session(stack)
    with stack.api("alice") as client:
        body = client.get(f"/api/v1/sessions/{session}").json()
    assert body["hosts"]["server"]["state"] == "failed"
    assert body["hosts"]["client"]["state"] == "ended" and body["hosts"]["lb"]["state"] == "ended"


def test_hosts_by_label_and_cancel_from_the_page(stack: UiStack) -> None:
    """A label selector picks the hosts (the lab labels each agent role=<name>); Cancel stops the agents."""
    opened = stack.page("alice")
    page = opened.page
    page.goto("/#/new")
    page.get_by_role("heading", name="New diagnosis").wait_for()
    page.get_by_role("radio", name="By label").check()
    page.get_by_label("Label selector").fill("role=server")
    page.get_by_label("Diagnostic").select_option("drops")
    page.get_by_label("Duration (seconds)").fill("25")
    page.get_by_role("button", name="Start diagnosis").click()
    session = session_id(page)
    expect(page.locator(".hostcard")).to_have_count(1)
    wait_cards(page, {"server": "running"}, 40)
    page.get_by_role("button", name="Cancel session").click()
    expect(page.locator(".session-head .badge")).to_have_text("cancelled", timeout=20_000)
    wait_cards(page, {"server": "ended"}, 20)
    expect(card(page, "server")).to_contain_text("cancelled")
    expect(page.get_by_role("button", name="Cancel session")).to_be_hidden()
    with stack.api("alice") as client:
        body = client.get(f"/api/v1/sessions/{session}").json()
    assert list(body["hosts"]) == ["server"] and body["state"] == "cancelled", body
    opened.assert_no_errors()


def test_history_reopens_the_session_and_the_audit_lists_the_three_decisions(stack: UiStack) -> None:
    diagnose = diagnose_session(stack)
    killed = killed_session(stack)
    narrow_refusal(stack)

    opened = stack.page("alice")
    page = opened.page
    page.get_by_role("link", name="History").click()
    expect(page.locator(f'tr[data-session="{diagnose}"]')).to_be_visible()
    expect(page.locator(f'tr[data-session="{killed}"]')).to_be_visible()
    stack.shot(page, "history")
    page.locator(f'tr[data-session="{diagnose}"] a').click()
    expect(page.get_by_text("Reopened from history (read-only).")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel session")).to_be_hidden()
    with stack.api("alice") as client:
        expect_ended(page, client.get(f"/api/v1/sessions/{diagnose}").json())
    expect(page.locator(".verdict").filter(has_text=RULE).first).to_be_visible()
    for host in HOSTS:
        expect(card(page, host)).to_have_attribute("data-state", "ended")
    assert page.locator(".trow").count() > 0
    opened.assert_no_errors()

    admin = stack.page("root")
    page = admin.page
    page.get_by_role("link", name="Audit").click()
    page.get_by_role("heading", name="Audit").wait_for()
    creates = page.locator('tr[data-action="session.create"]')
    expect(creates.filter(has_text=diagnose)).to_have_count(1)
    expect(creates.filter(has_text=killed)).to_have_count(1)
    expect(creates.filter(has_text=diagnose).locator(".badge")).to_have_text("allow")
    refused = creates.filter(has_text=NARROW_USER).filter(has_text="diagnose")
    expect(refused.first.locator(".badge")).to_have_text("deny")
    # A session's end is no "allow": it shows what came of it, and the hosts that did not end, with why.
    with stack.api("root") as client:
        ends = {e["session"]: e for e in client.get("/api/v1/audit").json() if e["action"] == "session.end"}
    assert ends[diagnose]["result"] == "ended" and ends[killed]["result"] == "partial", ends
    finished = page.locator('tr[data-action="session.end"]')
    expect(finished.filter(has_text=diagnose).locator(".badge")).to_have_text("ended")
    partial = finished.filter(has_text=killed)
    expect(partial.locator(".badge")).to_have_text("partial")
    expect(partial).to_have_attribute("data-result", "partial")
    server = ends[killed]["host_states"]["server"]
    expect(partial.locator(".unfinished")).to_have_text(f"server failed: {server['reason']}")
    assert "stopped answering" in server["reason"]
    stack.shot(page, "audit")
    # Filtering narrows the table to the refusals of that user only.
    page.get_by_label("User").fill(NARROW_USER)
    page.get_by_label("Decision").select_option("deny")
    page.get_by_role("button", name="Apply").click()
    rows = page.locator("tbody tr[data-seq]")
    expect(rows.first).to_be_visible()
    decisions = rows.evaluate_all("rows => rows.map(r => r.dataset.decision)")
    assert decisions and set(decisions) == {"deny"}
    users = rows.locator("td:nth-child(2)").all_inner_texts()
    assert all(re.match(NARROW_USER, text) for text in users), users
    admin.assert_no_errors()


# What a Linux 5.4 kernel built with BTF probes differently from this one (netsleuth.bpf.features): no tp_btf
# or fentry (5.5), no ring buffers (5.8), none of the newer tracepoint arguments. Run-time accounting is on
# there only because its administrator set kernel.bpf_stats_enabled=1 (BPF_ENABLE_STATS is 5.8 too).
LINUX_5_4_LACKS = dict.fromkeys(
    (
        "ring_buffer",
        "tp_btf",
        "fentry",
        "drop_reasons",
        "kfree_skb_rx_sk",
        "consume_skb_location",
        "reset_reasons",
        "retransmit_err",
    ),
    False,
)
OLD_HOST = "old-kernel"
NO_ACCOUNTING = (
    "BPF run-time accounting is off and the agent cannot turn it on: give it CAP_SYS_ADMIN "
    "(BPF_ENABLE_STATS, Linux 5.8 or newer) or set kernel.bpf_stats_enabled=1"
)


def listed_hosts(stack: UiStack) -> dict[str, dict[str, Any]]:
    with stack.api("root") as client:
        return {host["host"]: host for host in client.get("/api/v1/hosts").json()}


def test_the_hosts_page_says_which_diagnostics_each_host_runs_and_why_not_in_words(
    stack: UiStack, bpf_stats_sysctl: Callable[[str], None]
) -> None:
    """The controller answers, per host, which of its diagnostics it can run and why not the others (each
    diagnostic's needs and every agent session's, against what its agent probed); the page shows that, with
    the raw BPF flags folded away, and the agents agree.

    lb's agent is restarted as the systemd unit runs it (its capabilities, so no CAP_SYS_ADMIN) on a machine
    whose kernel.bpf_stats_enabled is 0, as when the unit's ExecStartPre is missing: it cannot account its
    programs' run time, so it refuses every session, and the page says so before anyone tries. A kernel this
    machine cannot be - 5.4 - is the entry the client's agent registered with the facts 5.4 probes
    differently, written into the registry."""
    opened = stack.page("root")
    page = opened.page
    listed = listed_hosts(stack)
    for host in HOSTS:
        support = listed[host]["support"]
        assert [entry["diagnostic"] for entry in support] == listed[host]["diagnostics"], support
        assert all(entry["runs"] is True for entry in support), support  # this machine runs them all
        row = page.locator(f'tr[data-host="{host}"]')
        expect(row.locator("td.support")).to_contain_text(f"Runs all {len(support)} diagnostics")
        # The flags are there for whoever wants them, folded: none shows until asked for.
        expect(row.locator("details.features summary")).to_have_text("BPF features")
        expect(row.locator("details.features .tag").first).to_be_hidden()
    real = stack.lab.registry()["client"]
    now_ns = time.time_ns()
    old = dataclasses.replace(
        real,
        host=OLD_HOST,
        hostname=OLD_HOST,
        kernel="5.4.0-216-generic",
        features={**real.features, **LINUX_5_4_LACKS, "kernel": "5.4.0-216-generic"},
        labels={"role": OLD_HOST},
        namespaces=[],
        containers=[],
        heartbeat=datetime.datetime.fromtimestamp(now_ns / 1e9, datetime.UTC).isoformat(),
        heartbeat_ns=now_ns,
    )
    try:
        bpf_stats_sysctl("0")
        stack.lab.stop_agent("lb")
        stack.lab.start_agent("lb", argv_prefix=setpriv_prefix(unit_capabilities()))
        stack.lab.put_registry_entry(old)
        wait_for(
            lambda: (
                OLD_HOST in listed_hosts(stack)
                and listed_hosts(stack)["lb"]["features"]["bpf_stats"] is False
            ),
            30,
            f"the controller to list {OLD_HOST} and lb's agent without run-time accounting",
        )
        listed = listed_hosts(stack)
        # lb runs none: every session needs the accounting its agent cannot have.
        lb = listed["lb"]["support"]
        assert lb and all(entry["runs"] is False and entry["why"] == [NO_ACCOUNTING] for entry in lb), lb
        lb_row = page.locator('tr[data-host="lb"]')
        expect(lb_row.locator("td.support")).to_contain_text(
            f"Runs none of its {len(lb)} diagnostics", timeout=15_000
        )
        expect(lb_row.locator(".why-not li")).to_have_text(f"Cannot run any of them: {NO_ACCOUNTING}.")
        # The 5.4 kernel runs what does without ring buffers.
        support = listed[OLD_HOST]["support"]
        cannot = [entry for entry in support if entry["runs"] is False]
        assert 0 < len(cannot) < len(support), support
        assert {tuple(entry["why"]) for entry in cannot} == {
            ("this kernel lacks BPF ring buffers (needs Linux 5.8 or newer)",)
        }
        row = page.locator(f'tr[data-host="{OLD_HOST}"]')
        runs = len(support) - len(cannot)
        expect(row.locator("td.support")).to_contain_text(
            f"Runs {runs} of {len(support)} diagnostics", timeout=15_000
        )
        names = ", ".join(entry["diagnostic"] for entry in cannot)
        expect(row.locator(".why-not li")).to_have_text(
            f"Cannot run {names}: this kernel lacks BPF ring buffers (needs Linux 5.8 or newer)."
        )
        stack.shot(page, "hosts-what-each-runs")
        # The runnable ones are one click away; the flags another.
        row.locator("details.runnable summary").click()
        shown = row.locator("details.runnable .tag").all_inner_texts()
        assert shown == [entry["diagnostic"] for entry in support if entry["runs"]], shown
        row.locator("details.features summary").click()
        expect(row.locator("details.features .tag.lacks").filter(has_text="no ring_buffer")).to_be_visible()
        # New diagnosis says so as soon as such a host and diagnostic are chosen, before any request.
        page.goto("/#/new")
        page.get_by_role("heading", name="New diagnosis").wait_for()
        page.get_by_role("checkbox", name=OLD_HOST).check()
        page.get_by_label("Diagnostic").select_option(cannot[0]["diagnostic"])
        hint = page.locator(".field").filter(has=page.get_by_label("Diagnostic")).locator(".hint")
        expect(hint).to_have_text(f"{OLD_HOST} cannot run it: {cannot[0]['why'][0]}.")
        page.get_by_role("checkbox", name=OLD_HOST).uncheck()
        page.get_by_role("checkbox", name="lb").check()
        page.get_by_label("Diagnostic").select_option("drops")
        expect(hint).to_have_text(f"lb cannot run it: {NO_ACCOUNTING}.")
        # And lb's agent agrees: sent anyway, the task is refused with its own sentence.
        page.get_by_role("button", name="Start diagnosis").click()
        session_id(page)
        wait_cards(page, {"lb": "rejected"}, 30)
        expect(card(page, "lb")).to_contain_text("BPF run-time accounting is off")
        opened.assert_no_errors()
    finally:
        stack.lab.delete_registry_entry(OLD_HOST)
        stack.lab.stop_agent("lb")
        stack.lab.start_agent("lb")
        wait_for(
            lambda: (
                OLD_HOST not in listed_hosts(stack) and listed_hosts(stack)["lb"]["features"]["bpf_stats"]
            ),
            30,
            f"{OLD_HOST} to leave the registry and lb's agent to come back as it was",
        )
