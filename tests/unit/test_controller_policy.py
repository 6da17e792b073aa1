"""The controller's configuration, authentication, authorisation and request parsing, without NATS."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from netsleuth.controller.auth import Authenticator, AuthError, Principal, hash_token, token_matches
from netsleuth.controller.config import ControllerConfig, load_controller_config, parse_controller_config
from netsleuth.controller.rbac import Denied, Rbac
from netsleuth.controller.requests import BadRequest, Selector, parse_session_request
from netsleuth.errors import UsageError
from netsleuth.fleet.protocol import generate_private_key, private_key_to_text

DIAGNOSTICS = ("drops", "resets", "conn", "diagnose")
TOKEN = "alice-token-0123456789abcdef"


def _config(tmp_path: Path, extra: dict[str, Any] | None = None) -> ControllerConfig:
    key = tmp_path / "signing.key"
    key.write_text(private_key_to_text(generate_private_key()))
    data: dict[str, Any] = {
        "signing": {"key_file": "signing.key"},
        "roles": {
            "web": {"diagnostics": ["drops", "conn"], "hosts": ["web-*", "label:tier=web"], "netns": ["web"]},
            "ops": {"diagnostics": ["*"], "hosts": ["*"], "netns": ["host"], "max_duration": 120},
            "admins": {"admin": True, "diagnostics": ["*"], "hosts": ["*"], "netns": ["*"]},
            "team-a": {"diagnostics": ["drops"], "hosts": ["*"], "k8s_namespaces": ["team-a"]},
        },
        "users": [
            {"name": "alice", "token_hash": hash_token(TOKEN), "roles": ["web"]},
            {"name": "olga", "token_hash": hash_token("olga-token-0123456789", "scrypt"), "roles": ["ops"]},
        ],
    }
    data.update(extra or {})
    return parse_controller_config(data, "test", tmp_path)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"signing": {}}, "signing.key_file"),
        ({"signing": {"key_file": "missing.key"}}, "does not exist"),
        ({"sessions": {"prepare_timeout": -1}}, "sessions.prepare_timeout must be a number above 0"),
        ({"sessions": {"prepare_timout": 3}}, "unknown setting sessions.prepare_timout"),
        ({"users": [{"name": "x", "token_hash": "plain", "roles": []}]}, "hash-token"),
        ({"users": [{"name": "x", "token_hash": hash_token("t" * 20), "roles": ["nope"]}]}, "role 'nope'"),
        ({"roles": {"r": {"hosts": ["label:tier"]}}, "users": []}, "label:KEY=VALUE"),
        ({"http": {"listen": "nowhere"}}, "http.listen must be HOST:PORT"),
        ({"nats": {"url": "http://x"}}, "nats.url"),
        ({"nats": {"url": "nats://a:4222,http://b"}}, "nats.url must be one or more nats://"),
        ({"nats": {"replicas": 0}}, "nats.replicas must be a whole number from 1 to 5"),
        ({"nats": {"replicas": "3"}}, "nats.replicas"),
        ({"users": []}, "nobody could ever log in"),
    ],
)
def test_config_mistakes_are_one_sentence(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError) as raised:
        _config(tmp_path, change)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_nats_cluster_urls_and_replicas(tmp_path: Path) -> None:
    """A cluster's URLs, comma-separated or as a list, and the copies of every stream the controller makes."""
    urls = ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"]
    for written in (",".join(urls), urls, " , ".join(urls)):
        config = _config(tmp_path, {"nats": {"url": written, "replicas": 3}})
        assert config.nats.urls == tuple(urls) and config.nats.replicas == 3
    assert _config(tmp_path).nats.replicas == 1


_CREDS = """-----BEGIN NATS USER JWT-----
eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.e30.c2ln
------END NATS USER JWT------

-----BEGIN USER NKEY SEED-----
SUAEXAMPLEONLYNOTAREALSEED
------END USER NKEY SEED------
"""


def test_nats_creds_file(tmp_path: Path) -> None:
    """nats.creds_file: relative to the config's directory like the other files, and checked at load."""
    creds = tmp_path / "controller.creds"
    creds.write_text(_CREDS)
    creds.chmod(0o600)
    config = _config(tmp_path, {"nats": {"url": "nats://n:4222", "creds_file": "controller.creds"}})
    assert config.nats.creds_file == str(creds)
    (tmp_path / "open.creds").write_text(_CREDS)
    (tmp_path / "open.creds").chmod(0o644)
    (tmp_path / "seed.creds").write_text("SUAEXAMPLEONLYNOTAREALSEED\n")
    (tmp_path / "seed.creds").chmod(0o600)
    for name, words in [
        ("missing.creds", f"nats.creds_file {tmp_path / 'missing.creds'}: No such file or directory"),
        ("open.creds", "readable by other users: chmod 600 it"),
        ("seed.creds", f"nats.creds_file {tmp_path / 'seed.creds'} is not a NATS .creds file"),
    ]:
        with pytest.raises(UsageError) as raised:
            _config(tmp_path, {"nats": {"url": "nats://n:4222", "creds_file": name}})
        assert words in str(raised.value) and "\n" not in str(raised.value)


def test_nats_nkey_seed_file(tmp_path: Path) -> None:
    """nats.nkey_seed_file: relative to the config's directory, checked at load (exists, owner-only, a user
    seed), the only login method given; one sentence for each mistake."""
    import nkeys

    seed = tmp_path / "controller.nk"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) + b"\n")
    seed.chmod(0o600)
    config = _config(tmp_path, {"nats": {"url": "nats://n:4222", "nkey_seed_file": "controller.nk"}})
    assert config.nats.nkey_seed_file == str(tmp_path / "controller.nk")
    assert config.nats.user is None and config.nats.password is None and config.nats.creds_file is None
    (tmp_path / "open.nk").write_bytes(seed.read_bytes())
    (tmp_path / "open.nk").chmod(0o644)
    (tmp_path / "junk.nk").write_text("SUnot-a-seed\n")
    (tmp_path / "junk.nk").chmod(0o600)
    (tmp_path / "pw").write_text("secret\n")
    for nats, words in [
        (
            {"nkey_seed_file": "missing.nk"},
            "nats.nkey_seed_file " + str(tmp_path / "missing.nk") + ": No such",
        ),
        ({"nkey_seed_file": "open.nk"}, "readable by other users"),
        ({"nkey_seed_file": "junk.nk"}, "does not hold an nkey seed"),
        ({"nkey_seed_file": ""}, "nats.nkey_seed_file must be a non-empty string"),
        ({"nkey_seed_file": "controller.nk", "password": "x"}, "nats takes one of password, password_file"),
        ({"nkey_seed_file": "controller.nk", "creds_file": "c.creds"}, "(got creds_file and nkey_seed_file)"),
        ({"password": "x", "password_file": "pw"}, "(got password and password_file)"),
        (
            {"nkey_seed_file": "controller.nk", "user": "c"},
            "nats.user goes with a password, not with nats.nkey",
        ),
        ({"creds_file": "c.creds", "user": "c"}, "nats.user goes with a password, not with nats.creds_file"),
    ]:
        with pytest.raises(UsageError) as raised:
            _config(tmp_path, {"nats": nats})
        assert words in str(raised.value) and "\n" not in str(raised.value), (nats, str(raised.value))
    # A password login is unchanged.
    assert _config(tmp_path, {"nats": {"user": "c", "password_file": "pw"}}).nats.password == "secret"


def test_config_file_that_is_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[http\n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        load_controller_config(path)


def test_tokens_are_checked_against_hashes_only(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert TOKEN not in json.dumps([user.token_hash for user in config.users])
    auth = Authenticator(config)
    assert auth.authenticate(f"Bearer {TOKEN}") == Principal("alice", ("web",), "token")
    assert auth.authenticate("Bearer olga-token-0123456789").user == "olga"  # scrypt
    for header, words in [
        (None, "needs an Authorization"),
        ("Basic abc", "Bearer"),
        ("Bearer wrong", "not valid"),
        ("Bearer " + "x" * 9000, "too long"),
    ]:
        with pytest.raises(AuthError, match=words):
            auth.authenticate(header)
    assert token_matches(TOKEN, hash_token(TOKEN, "scrypt")) and not token_matches("other", hash_token(TOKEN))


def test_oidc_jwt_against_a_jwks_file(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    jwk = json.loads(jwt.algorithms.OKPAlgorithm.to_jwk(key.public_key()))
    (tmp_path / "jwks.json").write_text(
        json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "EdDSA", "use": "sig"}]})
    )
    config = _config(
        tmp_path,
        {"oidc": {"jwks_file": "jwks.json", "issuer": "https://idp.example", "audience": "netsleuth",
                  "user_claim": "email", "roles_claim": "groups"}},
    )  # fmt: skip
    auth = Authenticator(config)
    now = datetime.datetime.now(datetime.UTC)
    claims = {"iss": "https://idp.example", "aud": "netsleuth", "email": "dev@example.org",
              "groups": ["web", "not-a-role"], "exp": now + datetime.timedelta(minutes=5)}  # fmt: skip
    token = jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": "k1"})
    assert auth.authenticate(f"Bearer {token}") == Principal("dev@example.org", ("web",), "oidc")
    expired = jwt.encode({**claims, "exp": now - datetime.timedelta(minutes=1)}, key, "EdDSA", {"kid": "k1"})
    with pytest.raises(AuthError, match="expired"):
        auth.authenticate(f"Bearer {expired}")
    wrong_audience = jwt.encode({**claims, "aud": "other"}, key, "EdDSA", {"kid": "k1"})
    with pytest.raises(AuthError, match="not valid"):
        auth.authenticate(f"Bearer {wrong_audience}")
    forged = jwt.encode(claims, Ed25519PrivateKey.generate(), "EdDSA", {"kid": "k1"})
    with pytest.raises(AuthError, match="not valid"):
        auth.authenticate(f"Bearer {forged}")


def test_roles_allow_only_what_one_role_grants(tmp_path: Path) -> None:
    rbac = Rbac(_config(tmp_path))
    alice = Principal("alice", ("web",), "token")
    web1 = {"host": "web-1", "labels": {}}
    tagged = {"host": "db-7", "labels": {"tier": "web"}}
    rbac.check_session(alice, "drops", [web1, tagged], "web")
    cases = [
        ("resets", [web1], "web", "do not allow diagnostic resets"),
        ("drops", [{"host": "db-1", "labels": {}}], "web", "on host db-1"),
        ("drops", [web1], "db", "network namespace db on host web-1"),
        ("drops", [web1], None, "network namespace host"),
    ]
    for diagnostic, hosts, netns, words in cases:
        with pytest.raises(Denied, match=words):
            rbac.check_session(alice, diagnostic, hosts, netns)
    with pytest.raises(Denied, match="no role"):
        rbac.check_session(Principal("x", ("gone",), "oidc"), "drops", [web1], "web")
    assert rbac.may_see(alice, tagged) and not rbac.may_see(alice, {"host": "db-1"})
    assert not rbac.is_admin(alice) and rbac.is_admin(Principal("r", ("admins",), "token"))
    assert rbac.limits(Principal("o", ("ops", "web"), "token")).max_duration == 120


def test_a_role_scoped_by_kubernetes_namespace_grants_that_namespaces_pods_only(tmp_path: Path) -> None:
    from netsleuth.controller.app import _asked_scope
    from netsleuth.controller.requests import SessionRequest
    from netsleuth.fleet.protocol import Scope

    rbac = Rbac(_config(tmp_path))
    amy = Principal("amy", ("team-a",), "token")
    node = {"host": "node-1", "labels": {}}
    rbac.check_session(amy, "drops", [node], None, "team-a")
    assert rbac.allowed(amy)["k8s_namespaces"] == ["team-a"]
    with pytest.raises(Denied, match="do not allow Kubernetes namespace team-b on host node-1"):
        rbac.check_session(amy, "drops", [node], None, "team-b")
    # No namespace chosen is the host's own: not hers, and the sentence says what her roles do allow.
    with pytest.raises(Denied, match=r"network namespace host on host node-1.*Kubernetes namespace team-a"):
        rbac.check_session(amy, "drops", [node], None)
    # netns "*" grants every namespace, pods' included.
    rbac.check_session(Principal("root", ("admins",), "token"), "drops", [node], None, "team-b")
    # What the request chooses is the task's scope: by its k8s_namespace, or its pod's namespace.
    asked = SessionRequest(("node-1",), None, "drops", {"pod": "team-a/web-1"}, 5.0)
    assert asked.k8s_namespace == "team-a" and _asked_scope(asked) == Scope(k8s_namespaces=("team-a",))
    plain = SessionRequest(("node-1",), None, "drops", {"netns": "web"}, 5.0)
    assert plain.k8s_namespace is None and _asked_scope(plain) == Scope(netns=("web",))
    assert Scope(k8s_namespaces=("team-a",)).to_json()["k8s_namespaces"] == ["team-a"]
    assert "k8s_namespaces" not in Scope(netns=("web",)).to_json()  # older tasks sign the same bytes


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{", 400, "not valid JSON"),
        (b'"x"', 400, "JSON object"),
        (b'{"diagnostic": "drops", "duration": 1}', 400, "exactly one of 'hosts'"),
        (
            b'{"hosts": ["a"], "selector": {"all": true}, "diagnostic": "drops", "duration": 1}',
            400,
            "exactly one",
        ),
        (b'{"hosts": [], "diagnostic": "drops", "duration": 1}', 400, "non-empty list"),
        (b'{"hosts": ["a.b"], "diagnostic": "drops", "duration": 1}', 400, "host id"),
        (b'{"hosts": ["a"], "diagnostic": "bpftrace", "duration": 1}', 422, "unknown diagnostic"),
        (b'{"hosts": ["a"], "diagnostic": "drops", "duration": true}', 400, "duration"),
        (
            b'{"hosts": ["a"], "diagnostic": "drops", "duration": 1, "config": {"Bad": 1}}',
            400,
            "is not an option name",
        ),
        (b'{"hosts": ["a"], "diagnostic": "drops", "duration": 1, "config": {"netns": ""}}', 400, "netns"),
        (
            b'{"hosts": ["a"], "diagnostic": "drops", "duration": 1, "config": {"comm": "'
            + b"x" * 300
            + b'"}}',
            413,
            "longer than",
        ),
        (
            b'{"hosts": ["a"], "diagnostic": "drops", "duration": 1, "config": {"host": [[1]]}}',
            400,
            "list of",
        ),
        (b'{"hosts": ["a"], "diagnostic": "drops", "duration": 1, "x": 1}', 400, "unknown field 'x'"),
        (b" " * 70_000, 413, "larger than 64 KiB; a session on many hosts is asked for with a selector"),
        (
            json.dumps(
                {"hosts": [f"h{n}" for n in range(2000)], "diagnostic": "drops", "duration": 1}
            ).encode(),
            413,
            "at most 1024 are allowed; a session on many hosts is asked for with a selector",
        ),
        (b'{"selector": {}, "diagnostic": "drops", "duration": 1}', 400, '{"selector": {"all": true}}'),
        (
            b'{"selector": {"all": false}, "diagnostic": "drops", "duration": 1}',
            400,
            "selector.all must be true (got False)",
        ),
        (
            b'{"selector": {"all": true, "zone": "a"}, "diagnostic": "drops", "duration": 1}',
            400,
            "unknown field 'zone' of selector (known: all, labels, netns, pod, k8s_namespace)",
        ),
        (
            b'{"selector": {"pod": "db-0"}, "diagnostic": "drops", "duration": 1}',
            400,
            "selector.pod must be NAMESPACE/NAME (got 'db-0')",
        ),
        (
            b'{"selector": {"labels": {"a": 1}}, "diagnostic": "drops", "duration": 1}',
            400,
            "selector.labels must be an object of label: value strings (at most 64)",
        ),
        (
            b'{"selector": {"zone": "a"}, "diagnostic": "drops", "duration": 1}',
            400,
            "unknown field 'zone' of selector",
        ),
        (b'{"selector": {"netns": ""}, "diagnostic": "drops", "duration": 1}', 400, "selector.netns"),
    ],
)
def test_session_requests_are_refused_with_one_sentence(body: bytes, status: int, words: str) -> None:
    with pytest.raises(BadRequest) as raised:
        parse_session_request(body, DIAGNOSTICS)
    assert raised.value.status == status and words in str(raised.value)


def test_a_good_session_request() -> None:
    body = {"hosts": ["lb", "lb", "server"], "diagnostic": "conn", "config": {"dport": 80, "netns": "web"},
            "duration": 5}  # fmt: skip
    request = parse_session_request(json.dumps(body).encode(), DIAGNOSTICS)
    assert request.hosts == ("lb", "server") and request.netns == "web" and request.duration == 5.0


def test_a_selector_names_hosts_by_labels_namespace_pod_or_all() -> None:
    def selector(raw: dict[str, object]) -> Selector:
        body = {"selector": raw, "diagnostic": "drops", "duration": 1}
        parsed = parse_session_request(json.dumps(body).encode(), DIAGNOSTICS).selector
        assert parsed is not None
        return parsed

    web = {
        "host": "w1",
        "labels": {"zone": "a", "tier": "web"},
        "namespaces": [{"name": "web", "inode": 4026532290}],
        "pods": [{"namespace": "team-b", "name": "db-0", "uid": "u", "netns": 4026532290, "labels": {}}],
    }
    bare = {"host": "b1", "labels": {"zone": "b"}}
    every = selector({"all": True})
    assert every.matches(web) and every.matches(bare) and every.to_json() == {"all": True}
    zone_a = selector({"labels": {"zone": "a"}})
    assert zone_a.matches(web) and not zone_a.matches(bare)
    assert selector({"labels": {"zone": "a", "tier": "web"}}).matches(web)
    assert not selector({"labels": {"zone": "a", "tier": "db"}}).matches(web)
    assert selector({"netns": "web"}).matches(web) and not selector({"netns": "web"}).matches(bare)
    assert selector({"pod": "team-b/db-0"}).matches(web) and not selector({"pod": "team-b/db-1"}).matches(web)
    assert selector({"k8s_namespace": "team-b"}).matches(web) and not selector(
        {"k8s_namespace": "x"}
    ).matches(web)
    both = selector({"labels": {"zone": "b"}, "pod": "team-b/db-0"})  # every criterion must hold
    assert not both.matches(web) and not both.matches(bare)
    assert both.to_json() == {"labels": {"zone": "b"}, "pod": "team-b/db-0"}


def test_controller_check_says_one_sentence_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from netsleuth.cli import main

    config = tmp_path / "controller.toml"
    assert main(["controller", "new-key", "--out", str(tmp_path / "signing.key")]) == 0
    config.write_text(
        '[signing]\nkey_file = "signing.key"\n[oidc]\njwks_file = "jwks.json"\nissuer = "i"\naudience = "a"\n'
    )
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    capsys.readouterr()
    assert main(["controller", "check", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "is not a usable JWKS" in error
    (tmp_path / "jwks.json").write_text("not json")
    assert main(["controller", "check", "--config", str(config)]) == 2
    assert main(["controller", "new-key", "--out", str(tmp_path / "signing.key")]) == 2  # never overwritten
