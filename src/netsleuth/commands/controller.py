"""`netsleuth controller`: the fleet controller (HTTP API + NATS orchestration), and its two helpers:
`hash-token` (what goes in the config instead of a token) and `new-key` (the Ed25519 signing key)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from netsleuth.commands import Command
from netsleuth.errors import UsageError

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        default="serve",
        choices=("serve", "check", "hash-token", "new-key"),
        help="serve (default); check the config; hash-token: print the hash of a token for [[users]]; "
        "new-key: write a new Ed25519 signing key and print the public key for the agents",
    )
    parser.add_argument("--config", metavar="FILE", help="the controller's TOML configuration (serve, check)")
    parser.add_argument(
        "--ready-file", metavar="PATH", help="write the bound address (JSON) here once serving"
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        help="hash-token: read the token from FILE (default: a new random token)",
    )
    parser.add_argument("--scrypt", action="store_true", help="hash-token: scrypt instead of SHA-256")
    parser.add_argument("--out", metavar="FILE", help="new-key: where to write the private key")
    parser.add_argument("--verbose", action="store_true", help="log at debug level")


def _hash_token(args: argparse.Namespace) -> int:
    from netsleuth.controller.auth import hash_token, new_token

    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as error:
            raise UsageError(f"cannot read --token-file {args.token_file}: {error.strerror}") from error
        if len(token) < 16:
            raise UsageError("the token is shorter than 16 characters; use a long random one")
    else:
        token = new_token()
        sys.stdout.write(f"token: {token}\n")
    sys.stdout.write(f'token_hash = "{hash_token(token, "scrypt" if args.scrypt else "sha256")}"\n')
    return 0


def _new_key(args: argparse.Namespace) -> int:
    from netsleuth.fleet.protocol import generate_private_key, private_key_to_text, public_key_to_text

    if not args.out:
        raise UsageError("new-key needs --out FILE (where the private key goes)")
    out = Path(args.out)
    if out.exists():
        raise UsageError(f"{out} exists; refusing to overwrite a signing key")
    key = generate_private_key()
    try:
        descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as error:
        raise UsageError(f"cannot create {out}: {error.strerror}") from error
    with os.fdopen(descriptor, "w") as handle:
        handle.write(private_key_to_text(key) + "\n")
    # The lines as each agent's [fleet] table reads them (fleet/link_config.py), ready to paste.
    sys.stdout.write(
        "# in each agent's [fleet] section:\n"
        f'controller_key = "{public_key_to_text(key.public_key())}"\n'
        'controller_key_id = "controller-1"   # the same as this controller\'s signing.key_id\n'
    )
    return 0


def run(args: argparse.Namespace) -> int:
    from netsleuth.extras import require_extra

    require_extra("controller", "netsleuth controller")
    if args.action == "hash-token":
        return _hash_token(args)
    if args.action == "new-key":
        return _new_key(args)
    if not args.config:
        raise UsageError(f"`netsleuth controller {args.action}` needs --config FILE")
    from netsleuth.controller.config import load_controller_config
    from netsleuth.fleet.protocol import private_key_from_text

    config = load_controller_config(Path(args.config))
    try:
        private_key_from_text(config.signing_key_file.read_text())
    except OSError as error:
        raise UsageError(
            f"cannot read signing.key_file {config.signing_key_file}: {error.strerror}"
        ) from error
    except UsageError as error:
        raise UsageError(f"signing.key_file {config.signing_key_file}: {error}") from error
    from netsleuth.controller.auth import Authenticator

    Authenticator(config)  # reads the OIDC JWKS file now: a bad one is a sentence here, not a failed start
    if args.action == "check":
        sys.stdout.write(
            f"config {config.source}: OK ({len(config.users)} users, {len(config.roles)} roles)\n"
        )
        return 0
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="netsleuth controller: %(levelname)s %(message)s",
    )
    from netsleuth.controller.server import serve

    return serve(config, Path(args.ready_file) if args.ready_file else None)


COMMAND = Command(
    name="controller",
    help="the fleet controller: HTTP API, permissions, audit, synchronised sessions over NATS",
    add_arguments=add_arguments,
    run=run,
)
