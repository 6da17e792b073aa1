"""The controller's refusal of a config names the field to blame apart from its sentence, so the web form
marks its own field and words it with its own label, while the sentence keeps the CLI's flag for the CLI;
and a session's end is audited with what came of it, not only an "allow"."""

from __future__ import annotations

from typing import Any

import pytest

from netsleuth.controller.app import _error
from netsleuth.controller.requests import BadRequest, SessionRequest, read_config
from netsleuth.controller.sessions import session_result


def _refusal(diagnostic: str, config: dict[str, Any]) -> BadRequest:
    with pytest.raises(BadRequest) as refused:
        read_config(SessionRequest(("client",), None, diagnostic, config, 5))
    return refused.value


@pytest.mark.parametrize(
    ("diagnostic", "config", "field", "problem", "flag"),
    [
        (
            "drops",
            {"dport": 99999},
            "dport",
            "99999 is not a port: give a number from 1 to 65535",
            "--dport",
        ),
        ("conn", {"pid": "x"}, "pid", "'x' is not a process id", "--pid"),
        ("resets", {"dst": ["not-an-ip"]}, "dst", "'not-an-ip' is not an IP address or CIDR", "--dst"),
        (
            "diagnose",
            {"comm": "a-name-longer-than-15"},
            "comm",
            "'a-name-longer-than-15' is not a name of 1 to 15 characters",
            "--comm",
        ),
        ("drops", {"family": 6, "dst": ["198.18.0.1"]}, "family", "contradicts the IPv4 address", "-6"),
        ("tcp.life", {"sample": 0}, "sample", "0 is not a sample rate: 1 (every event) or more", "--sample"),
    ],
)
def test_a_refused_field_is_named_apart_from_the_clis_sentence(
    diagnostic: str, config: dict[str, Any], field: str, problem: str, flag: str
) -> None:
    refusal = _refusal(diagnostic, config)
    assert refusal.status == 422
    assert refusal.field == field
    assert refusal.problem is not None and refusal.problem.startswith(problem)
    # The sentence is still the CLI's (`netsleuth fleet run` prints it): it names the flag.
    assert str(refusal).startswith(f"invalid config for {diagnostic}: {flag} ")
    body = _error(refusal.status, str(refusal), refusal.field, refusal.problem).body
    assert b'"field":"' + field.encode() + b'"' in body


def test_a_refusal_of_the_config_as_a_whole_names_no_field() -> None:
    refusal = _refusal("drops", {"nosuch": 1})
    assert refusal.field is None
    assert b'"field"' not in _error(refusal.status, str(refusal)).body


@pytest.mark.parametrize(
    ("state", "partial", "result"),
    [
        ("ended", False, "ended"),
        ("ended", True, "partial"),
        ("failed", True, "failed"),
        ("cancelled", False, "cancelled"),
    ],
)
def test_a_sessions_end_is_audited_with_what_came_of_it(state: str, partial: bool, result: str) -> None:
    assert session_result(state, partial) == result
