"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step has a token budget. Running sequences go first (a decode is one token; a prompt
still being prefilled gets the next chunk), then waiting ones join in arrival order while
budget, sequence slots and KV blocks last. So prefill chunks and decodes share one step, new
requests join at every step, and finished ones leave at once.

A request's n > 1 samples compute its prompt once: the step that ends the first sample's
prefill also schedules the others as its forks, which take its KV (`BlockManager.fork`), need
no tokens of their own and sample their first token from its last row's logits. Forks come
last in the batch.

When a running sequence cannot get a block, the newest running sequence is preempted: its
blocks are released and it goes back to the front of the waiting queue, to be recomputed from
its tokens later (prefix caching often gives most of them back). Its output so far is kept, so
greedy results do not change.
"""

from __future__ import annotations

import collections
import dataclasses

from jaxstack.serving._src.llm.block_manager import BlockManager
from jaxstack.serving._src.llm.sequence import Sequence, Status


@dataclasses.dataclass
class ScheduledBatch:
    """The sequences of one step, in order, with their new-token counts."""

    seqs: list[Sequence]
    num_new_tokens: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def rows(self, indices: list[int]) -> ScheduledBatch:
        """The batch of the sequences at `indices`, in that order."""
        return ScheduledBatch(
            [self.seqs[i] for i in indices], [self.num_new_tokens[i] for i in indices]
        )


class Scheduler:
    def __init__(self, blocks: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch([], [])
        forks: list[Sequence] = []
        budget = self.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens_to_compute(), budget)
            if n == 0:  # its last token is being sampled
                i += 1
                continue
            while not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                self._preempt(self.running.pop())
                preempted = True
                if i >= len(self.running):
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):  # none preempted now
            self._fork(seq, n, forks)
        # After a preemption the cache is full: admitting new work would only thrash.
        while self.waiting and budget > 0 and not preempted:
            if len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[0]
            if not seq.block_ids:
                seq.num_computed_tokens = seq.num_cached_tokens = self.blocks.take_cached_prefix(
                    seq
                )
            n = min(seq.num_tokens_to_compute(), budget)
            if not self.blocks.allocate(seq, seq.num_computed_tokens + n):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            self._fork(seq, n, forks)
        batch.seqs += forks
        batch.num_new_tokens += [0] * len(forks)
        return batch

    def _fork(self, parent: Sequence, n: int, forks: list[Sequence]) -> None:
        """If `parent`'s n scheduled tokens end its prompt, start its waiting forks from its
        KV (as many as sequence slots and free blocks allow; the others prefill their own)."""
        prompt = len(parent.prompt_token_ids)
        if not parent.forks or parent.num_computed_tokens + n != prompt:
            return
        for child in parent.forks:
            if child.status is not Status.WAITING or child.block_ids or child.num_computed_tokens:
                continue
            if len(self.running) >= self.max_num_seqs or not self.blocks.fork(
                child, parent, prompt
            ):
                break
            self.waiting.remove(child)
            child.status = Status.RUNNING
            child.num_computed_tokens = prompt
            child.parent = parent
            self.running.append(child)
            forks.append(child)
        parent.forks = []

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
