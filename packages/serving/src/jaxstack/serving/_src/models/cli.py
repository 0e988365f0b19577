"""`jaxstack-serve-models`: serve a model repository over KServe v2 REST."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import time
from collections.abc import Sequence
from types import FrameType

import uvicorn

from jaxstack.serving._src.errors import Error
from jaxstack.serving._src.models.http import create_app
from jaxstack.serving._src.models.repository import ModelConfig
from jaxstack.serving._src.models.server import ModelServer


class _DrainingServer(uvicorn.Server):
    """uvicorn with a drain: stop accepting, answer what open connections send, then close.

    uvicorn's own shutdown closes idle keep-alive connections at once, so a request a client
    sent just before gets a connection reset. Here the listener closes first, the app marks
    itself draining (every answer then says `Connection: close`), and open connections get up
    to `drain_s` to send and be answered before uvicorn closes what is left.
    """

    def __init__(self, config: uvicorn.Config, *, drain_s: float):
        super().__init__(config)
        self.drain_s = drain_s

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured SIGTERM after its shutdown, which would kill the process
        # before the model server drains; `serve` drains and returns instead.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        self.config.app.state.draining = True
        deadline = time.monotonic() + self.drain_s
        while self.server_state.connections and time.monotonic() < deadline:
            if self.force_exit:
                break
            await asyncio.sleep(0.05)
        await super().shutdown(sockets)


def serve(
    server: ModelServer,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    sock: socket.socket | None = None,
    log_level: str = "warning",
    drain_s: float = 5.0,
) -> None:
    """Run the REST front end of `server` until SIGINT/SIGTERM, then drain it.

    `server` may still be loading (`start(wait=False)`): the port opens at once. On a signal,
    open connections get up to `drain_s` seconds to be answered before they close, then the
    model server drains its queues. Binds 127.0.0.1 by default: exposing a model server is a
    decision, not a default.
    """
    config = uvicorn.Config(
        create_app(server), host=host, port=port, log_level=log_level, access_log=False
    )
    try:
        _DrainingServer(config, drain_s=drain_s).run(sockets=[sock] if sock is not None else None)
    finally:
        server.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxstack-serve-models",
        description="Serve every model of a <model>/<version>/ repository of jaxstack "
        "StableHLO artifacts over KServe v2 REST, with dynamic batching and hot reload.",
    )
    p.add_argument("--repository", required=True, help="model repository root")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--config",
        help="JSON/YAML serving config (default: serving.json/.yaml in the repository, if any)",
    )
    p.add_argument("--poll-interval", type=float, default=2.0, help="seconds; 0: no hot reload")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    p.add_argument("--max-queue-size", type=int, default=256)
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        help="seconds open connections get to be answered after SIGTERM (default 5)",
    )
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    try:
        defaults = ModelConfig(
            max_batch_size=args.max_batch_size,
            max_queue_delay_ms=args.max_queue_delay_ms,
            max_queue_size=args.max_queue_size,
        )
        server = ModelServer(
            args.repository,
            config=args.config,
            defaults=defaults,
            poll_interval_s=args.poll_interval,
        )
    except Error as e:
        logging.getLogger("jaxstack.serving.models").error("%s", e)
        return 2
    # Listen while the models load: liveness answers, readiness says 503 until they are ready.
    server.start(wait=False)
    print(
        f"listening on http://{args.host}:{args.port} (pid {os.getpid()}); loading "
        f"{args.repository}: /v2/health/ready says 503 until the models are ready",
        flush=True,
    )
    serve(
        server,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        drain_s=args.drain_timeout,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
