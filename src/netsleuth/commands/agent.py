"""`netsleuth agent`: the long-running service (Prometheus exporter + bounded session API)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

from netsleuth.commands import Command

__all__ = ["COMMAND"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML configuration (default: built-in defaults)")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument(
        "--ready-file", metavar="PATH", help="write the bound addresses (JSON) here once attached and serving"
    )
    parser.add_argument("--verbose", action="store_true", help="log every HTTP request")


def _notify_systemd(state: str) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET (Type=notify units)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    # systemd gone or not listening: nothing to tell.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, contextlib.suppress(OSError):
        notify.sendto(state.encode(), address)


def run(args: argparse.Namespace) -> int:
    from netsleuth.agent.config import load_config

    config = load_config(Path(args.config) if args.config else None)
    if args.check:
        sys.stdout.write(f"config {config.source}: OK\n")
        return 0
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="netsleuth agent: %(levelname)s %(message)s",
    )
    from netsleuth.agent.service import Agent
    from netsleuth.kernel.function_names import limit_malloc_arenas

    limit_malloc_arenas()  # before any thread starts, so every thread shares the two

    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # Installed before anything attaches, so a SIGTERM during start-up still ends in an orderly stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    agent = Agent(config)
    agent.start()
    try:
        if args.ready_file:
            assert agent.tcp_server is not None
            Path(args.ready_file).write_text(
                json.dumps(
                    {
                        "listen": str(agent.tcp_server.bound),
                        "socket": str(config.socket) if config.socket else None,
                        "attach": agent.attach_kind,
                        "pid": os.getpid(),
                    }
                )
                + "\n"
            )
        _notify_systemd("READY=1")
        while not stop.wait(1.0):
            pass
        _notify_systemd("STOPPING=1")
        logging.getLogger("netsleuth.agent").info("stopping")
    finally:
        agent.stop()
    return 0


COMMAND = Command(
    name="agent",
    help="long-running service: Prometheus metrics of drops and path health, and bounded sessions on request",
    add_arguments=add_arguments,
    run=run,
)
