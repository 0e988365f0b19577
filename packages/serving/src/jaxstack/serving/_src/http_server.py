"""uvicorn with a drain, shared by the model server and the LLM server."""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from types import FrameType

import uvicorn


class DrainingServer(uvicorn.Server):
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


def add_server_arguments(p: argparse.ArgumentParser, *, drain_timeout: float, drain_help: str):
    """--host, --port, --drain-timeout and --log-level, as both servers' commands take them."""
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--drain-timeout", type=float, default=drain_timeout, help=drain_help)
    p.add_argument("--log-level", default="info")
