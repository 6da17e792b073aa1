"""Running the controller: uvicorn serving the app, a ready file once it listens, a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from pathlib import Path

import uvicorn

from netsleuth.controller.app import create_app
from netsleuth.controller.config import ControllerConfig
from netsleuth.controller.streams import StreamProblem, connect_nats, ensure_streams
from netsleuth.errors import EnvironmentProblem

__all__ = ["serve"]

_log = logging.getLogger("netsleuth.controller")


def _bound_address(server: uvicorn.Server) -> tuple[str, int] | None:
    for listener in getattr(server, "servers", []) or []:
        for sock in listener.sockets:
            address = sock.getsockname()
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                return str(address[0]), int(address[1])
    return None


async def _check_nats(config: ControllerConfig) -> None:
    """One sentence now rather than uvicorn's "Application startup failed" later: NATS reachable, and its
    streams usable (created if missing)."""
    try:
        nc = await connect_nats(config)
    except Exception as error:  # nats-py raises several unrelated types for "cannot connect"
        raise EnvironmentProblem(
            f"cannot reach NATS at {config.nats.url} ({error or type(error).__name__}); "
            "is nats-server running with JetStream, and are the controller's credentials right?"
        ) from None
    try:
        await ensure_streams(nc.jetstream(), config)
    except StreamProblem as problem:
        raise EnvironmentProblem(str(problem)) from None
    finally:
        await nc.close()


async def _serve(config: ControllerConfig, ready_file: Path | None) -> None:
    await _check_nats(config)
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.http.host,
            port=config.http.port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            timeout_graceful_shutdown=3,
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            break
        await asyncio.sleep(0.02)
    if serving.done():
        serving.result()  # uvicorn's own failure (port in use, lifespan error)
        raise EnvironmentProblem(
            f"the controller could not start (NATS at {config.nats.url} reachable? "
            f"port {config.http.port} free?); see the log above"
        )
    address = _bound_address(server)
    if address is not None:
        _log.info("listening on http://%s:%d", *address)
        if ready_file is not None:
            temporary = ready_file.with_suffix(".tmp")
            temporary.write_text(json.dumps({"host": address[0], "port": address[1], "pid": os.getpid()}))
            temporary.replace(ready_file)
    await serving


def serve(config: ControllerConfig, ready_file: Path | None) -> int:
    try:
        asyncio.run(_serve(config, ready_file))
    except OSError as error:
        raise EnvironmentProblem(f"the controller could not start: {error.strerror or error}") from error
    return 0
