"""AsyncEngine: the engine's step loop on a thread of its own, fed by an asyncio server.

Handlers `submit` a prompt and read `Delta`s (new tokens and text of one sequence) from an
asyncio queue; `abort` cancels (a client that went away). All engine state is touched only by
the engine thread: submissions and aborts reach it through an inbox it drains between steps,
and results go back as snapshots rather than live objects, a step's together: one
`loop.call_soon_threadsafe` per event loop and step (not one per sequence), which puts every
Delta of the step on its request's queue. While more steps follow, a step's Deltas leave at
the engine's next launch, once that step's inputs are ready and right before its model program
starts: the event loop's per-token work (SSE chunks, socket writes) then runs while the model
computes, instead of contending for the GIL with this thread's preparation of the next step.
A request the engine fails (see LLMEngine.step) gets a `RequestFailedError` on its queue;
the thread and every other request carry on.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import threading
import time

from jaxstack.serving._src.errors import Error, QueueFullError, ServerBusyError
from jaxstack.serving._src.llm.engine import LLMEngine, SequenceUpdate
from jaxstack.serving._src.llm.metrics import LLMMetrics
from jaxstack.serving._src.llm.sampling_params import SamplingParams

logger = logging.getLogger("jaxstack.serving.llm")


class RequestFailedError(Error):
    """The engine failed this request (HTTP 500); the server and other requests are fine."""


@dataclasses.dataclass
class _Route:
    """Where a request's Deltas go, and how many of its sequences are still unfinished."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    tag: int
    n: int
    unfinished: int

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    """On the event loop: hand one step's items to their queues."""
    for queue, item in items:
        queue.put_nowait(item)


@dataclasses.dataclass(frozen=True)
class Delta:
    """What one step produced for one sequence of a submitted prompt."""

    tag: int  # the submitter's label for the prompt (its position in a multi-prompt request)
    index: int  # sample index within the prompt's n
    token_ids: list[int]
    text: str
    logprobs: list[float]
    top_logprobs: list[dict[int, float]] | None
    finish_reason: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, float] | None] | None  # on the first delta only


class AsyncEngine:
    def __init__(self, engine: LLMEngine, *, max_waiting: int = 256):
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = LLMMetrics(engine.stats, self.queue_length)
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._routes: dict[str, _Route] = {}
        # What the engine thread has for the handlers, by event loop, until `_send_out`.
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        self._last_token: dict[str, float] = {}
        self._ids = itertools.count()
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        engine.runner.before_launch = self._send_out

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=60)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    def queue_length(self) -> int:
        return len(self._inbox) + len(self.engine.scheduler.waiting)

    # ----------------------------------------------------------------- asyncio side
    def submit(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
        tag: int,
        *,
        adapter: str | None = None,
    ) -> str:
        """Queue a prompt (with a LoRA adapter's name, or None for the base model); its Deltas
        will arrive on `queue`. Returns the request id."""
        if not self.alive:
            raise ServerBusyError("the engine has stopped; see the server log")
        self.engine.check_request(prompt_token_ids, params)
        self.engine.adapter_number(adapter)
        if self.queue_length() >= self.max_waiting:
            raise QueueFullError(
                f"{self.queue_length()} requests are already waiting (limit {self.max_waiting}); "
                "retry later"
            )
        request_id = f"req-{next(self._ids)}"
        self._routes[request_id] = _Route(
            asyncio.get_running_loop(), queue, tag, params.n, params.n
        )
        self._post(("add", request_id, prompt_token_ids, params, adapter))
        return request_id

    def abort(self, request_id: str) -> None:
        self._post(("abort", request_id))

    def _post(self, command: tuple) -> None:
        with self._wake:
            self._inbox.append(command)
            self._wake.notify()

    # ------------------------------------------------------------------ engine side
    def _loop(self) -> None:
        try:
            while True:
                with self._wake:
                    while not (self._inbox or self.engine.has_unfinished() or self._stop):
                        self._wake.wait()
                    if self._stop:
                        return
                    commands = list(self._inbox)
                    self._inbox.clear()
                for command in commands:
                    self._apply(command)
                if self.engine.has_unfinished():
                    updates = self.engine.step()  # sends the previous step's at its launch
                    self._send_out()  # a step that launched nothing (none scheduled, failed)
                    for update in updates:
                        self._deliver(update)
                if not self.engine.has_unfinished():
                    self._send_out()  # no next step to wait for
                self.metrics.count(self.engine.stats())
        except BaseException as e:  # the thread must not die silently
            logger.exception("the LLM engine failed")
            self.error = e
            self._send_out()
            for route in self._routes.values():
                route.put(e)

    def _post_to(self, route: _Route, item) -> None:
        """Queue `item` for `route`'s handler; it leaves with the step's others."""
        self._outbox.setdefault(route.loop, []).append((route.queue, item))

    def _send_out(self) -> None:
        """One call per event loop hands it everything queued since the last call."""
        outbox, self._outbox = self._outbox, {}
        for loop, items in outbox.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _apply(self, command: tuple) -> None:
        if command[0] == "abort":
            request_id = command[1]
            self.metrics.finished.labels("abort").inc(self.engine.abort(request_id))
            route = self._routes.pop(request_id, None)
            for i in range(route.n if route else 0):
                self._last_token.pop(f"{request_id}-{i}", None)
            return
        _, request_id, prompt_token_ids, params, adapter = command
        if request_id not in self._routes:
            return  # aborted before it was added
        try:
            self.engine.add_request(prompt_token_ids, params, request_id, adapter=adapter)
        except Exception as e:
            self._fail(request_id, e)

    def _fail(self, request_id: str, error: BaseException) -> None:
        """Hand a request's failure to its handler (once, whatever its n)."""
        route = self._routes.pop(request_id, None)
        if route is None:
            return
        logger.error("the engine failed request %s", request_id, exc_info=error)
        self._post_to(
            route,
            RequestFailedError(
                f"the engine failed this request ({type(error).__name__}: {error}); the "
                "server goes on serving others"
            ),
        )

    def _deliver(self, update: SequenceUpdate) -> None:
        seq = update.seq
        if seq.error is not None:
            self._last_token.pop(seq.seq_id, None)
            self.metrics.finished.labels("error").inc()
            self._fail(seq.request_id, seq.error)
            return
        route = self._routes.get(seq.request_id)
        if route is None:
            return
        now = time.monotonic()
        n = len(update.new_token_ids)
        out = seq.output
        if n:
            last = self._last_token.get(seq.seq_id)
            if last is None:
                self.metrics.ttft.observe(now - seq.arrival_time)
            else:
                self.metrics.itl.observe(now - last)
            self._last_token[seq.seq_id] = now
        first = len(out.token_ids) == n
        delta = Delta(
            tag=route.tag,
            index=seq.index,
            token_ids=list(update.new_token_ids),
            text=update.new_text,
            logprobs=out.logprobs[len(out.logprobs) - n :],
            top_logprobs=None
            if out.top_logprobs is None
            else out.top_logprobs[len(out.top_logprobs) - n :],
            finish_reason=out.finish_reason,
            prompt_token_ids=seq.prompt_token_ids if first else [],
            prompt_logprobs=list(seq.prompt_logprobs) if first and seq.prompt_logprobs else None,
        )
        if update.finished:
            self._last_token.pop(seq.seq_id, None)
            self.metrics.e2e.observe(now - seq.arrival_time)
            self.metrics.finished.labels(out.finish_reason).inc()
            route.unfinished -= 1
            if not route.unfinished:
                del self._routes[seq.request_id]
        self._post_to(route, delta)
