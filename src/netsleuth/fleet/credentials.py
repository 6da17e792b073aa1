"""An agent's fleet credentials: a NATS user whose permissions reach only its host, and the `[fleet]`
section that uses it.

    python -m netsleuth.fleet.credentials node-a --url nats://nats.example:4222 \\
        --controller-key ed25519:BASE64 --out /etc/netsleuth

writes /etc/netsleuth/node-a.fleet.password (mode 0600) and prints two snippets: the user entry for the
nats-server configuration (`authorization.users`, see packaging/nats-server.conf) and the agent's
`[fleet]` section. `add_arguments` / `run` are the CLI's, for a `netsleuth fleet credentials` subcommand.
The password is generated here and written only to the file; the server entry carries it too, so keep
that configuration file mode 0600 (or replace the password with a bcrypt hash: `nats server passwd`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from netsleuth.errors import UsageError
from netsleuth.fleet.nats_config import agent_user
from netsleuth.fleet.protocol import ProtocolError, public_key_from_text, validate_host_id

__all__ = ["add_arguments", "agent_snippets", "main", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("host", help="the host id: 1-63 of a-z, 0-9 and '-'")
    parser.add_argument("--url", default="nats://127.0.0.1:4222", help="NATS URL(s) the agent dials")
    parser.add_argument("--controller-key", required=True, help="the controller's public key (ed25519:...)")
    parser.add_argument("--controller-key-id", default="controller-1")
    parser.add_argument("--netns", default="", help="scope the agent to one namespace (default: the host)")
    parser.add_argument("--out", default=".", help="directory for HOST.fleet.password (default: .)")


def agent_snippets(
    host: str, url: str, controller_key: str, key_id: str, password_file: Path, password: str, netns: str = ""
) -> tuple[str, str]:
    """(the nats-server user entry, the agent's [fleet] TOML)."""
    user = agent_user(host, password)
    server = json.dumps(user.to_config(), indent=2)
    fleet = (
        "[fleet]\n"
        f'url = "{url}"\n'
        f'host_id = "{host}"\n'
        f'user = "{user.user}"\n'
        f'password_file = "{password_file}"\n'
        f'controller_key = "{controller_key}"\n'
        f'controller_key_id = "{key_id}"\n'
        f'netns = "{netns}"\n'
    )
    return server, fleet


def run(args: argparse.Namespace) -> int:
    try:
        host = validate_host_id(args.host)
        public_key_from_text(args.controller_key)
    except ProtocolError as error:
        raise UsageError(str(error)) from None
    out = Path(args.out)
    if not out.is_dir():
        raise UsageError(f"--out {out} is not a directory")
    password_file = (out / f"{host}.fleet.password").resolve()
    if password_file.exists():
        raise UsageError(f"{password_file} exists: remove it first to rotate this host's credentials")
    password = agent_user(host).password
    # Created 0600 from the start, never briefly readable by others.
    descriptor = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(password + "\n")
    server, fleet = agent_snippets(
        host, args.url, args.controller_key, args.controller_key_id, password_file, password, args.netns
    )
    sys.stdout.write(
        f"# wrote {password_file} (0600)\n"
        f"# 1. nats-server: add to authorization.users (packaging/nats-server.conf), then reload:\n{server}\n"
        f"# 2. agent: add to /etc/netsleuth/agent.toml on {host}:\n{fleet}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netsleuth.fleet.credentials", description=__doc__)
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except UsageError as error:
        sys.stderr.write(f"netsleuth: {error}\n")
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
