"""`jaxstack-serve-models`: serve a model repository over KServe v2 REST."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

import uvicorn

from jaxstack.serving._src.errors import Error
from jaxstack.serving._src.http_server import DrainingServer, add_server_arguments

# The server and its app import JAX: they load inside the functions, so --help answers at once.
if TYPE_CHECKING:
    from jaxstack.serving._src.models.server import ModelServer


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
    from jaxstack.serving._src.models.http import create_app

    config = uvicorn.Config(
        create_app(server), host=host, port=port, log_level=log_level, access_log=False
    )
    try:
        DrainingServer(config, drain_s=drain_s).run(sockets=[sock] if sock is not None else None)
    finally:
        server.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxstack-serve-models",
        description="Serve every model of a <model>/<version>/ repository of jaxstack "
        "StableHLO artifacts over KServe v2 REST, with dynamic batching and hot reload.",
    )
    p.add_argument("--repository", required=True, help="model repository root")
    p.add_argument(
        "--config",
        help="JSON/YAML serving config (default: serving.json/.yaml in the repository, if any)",
    )
    p.add_argument("--poll-interval", type=float, default=2.0, help="seconds; 0: no hot reload")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    p.add_argument("--max-queue-size", type=int, default=256)
    add_server_arguments(
        p,
        drain_timeout=5.0,
        drain_help="seconds open connections get to be answered after SIGTERM (default 5)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    from jaxstack.serving._src.models.repository import ModelConfig
    from jaxstack.serving._src.models.server import ModelServer

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
