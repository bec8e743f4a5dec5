"""Sampling calls that reach the learner together run as one batched generate (sampling.py `sample_batch`).

The episodes of an iteration (and MCTS searches side by side) each ask for their next action at about the
same time. The learner takes up to `calls` sample_actions activities at once; each hands its input to the
batcher and waits (heartbeating). One thread runs the batches: it waits `window_s` after the first call of a
batch for the others, then, holding the GPU lock, runs the calls waiting (first come first served, up to `rows`
completions in all; a call asking for more runs alone) and hands each call its own answer or error. Updates
take the same lock, so sampling and updates never share the GPU at the same time.

The batch thread is the only one that samples, so a call cancelled while it waits (its thread interrupted by
the SDK) never interrupts the others' batch: it leaves the queue, or its answer is dropped.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# Heartbeat detail of a call while it waits; the learner's heartbeat timeout is a minute or more.
WAIT_BEAT_S = 5.0


def wait_step(deadline: float | None) -> float:
    """How long to wait before the next heartbeat or the deadline, whichever comes first."""
    if deadline is None:
        return WAIT_BEAT_S
    return max(0.0, min(WAIT_BEAT_S, deadline - time.monotonic()))


@dataclass
class _Call:
    inp: Any
    rows: int
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    batch_calls: int = 0


@dataclass(frozen=True)
class Batching:
    """How sampling calls are batched: `calls` at most (1: one at a time, no batching), `rows` completions at
    most, `window_s` waited for calls arriving together.

    The default batches on a GPU only. There a decoding step of 32 rows costs about what one of 4 does, so a batch
    of 8 calls answers them all in about the time one took (bench/RESULTS.md, "Batched colocated sampling"). On the
    CPU a batch costs about the sum of its calls, so every call would wait for the slowest of them, and the
    episodes, answered at once, would all hit the browsers at once: the default job's rollout was not faster
    batched (bench/rollout-speed.ts)."""

    calls: int = 8
    rows: int = 32
    window_s: float = 0.02

    @classmethod
    def from_env(cls, env=os.environ, cuda: bool | None = None) -> "Batching":
        def whole(name: str, default: int, low: int, high: int) -> int:
            raw = env.get(name, "")
            if raw == "":
                return default
            if not raw.isdigit() or not low <= int(raw) <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {raw!r}")
            return int(raw)

        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        return cls(
            calls=whole("HALO_SAMPLE_BATCH", cls.calls if cuda else 1, 1, 64),
            rows=whole("HALO_SAMPLE_BATCH_ROWS", cls.rows, 1, 4096),
            window_s=whole("HALO_SAMPLE_WINDOW_MS", int(cls.window_s * 1000), 0, 10_000) / 1000,
        )


class SampleBatcher:
    """`run(inputs)` answers a batch: one result or exception per input, in order."""

    def __init__(
        self, run: Callable[[list[Any]], list[Any]], gpu: threading.Lock, batching: Batching = Batching()
    ) -> None:
        self._run = run
        self._gpu = gpu
        self.batching = batching
        self._queue: list[_Call] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        # Calls per batch run so far (tests, benches, the log).
        self.batches: list[int] = []

    def submit(
        self, inp: Any, rows: int, beat: Callable[[dict], None], deadline: float | None = None
    ) -> tuple[Any, int]:
        """Waits for `inp`'s answer; returns it with the number of calls of its batch, or raises its error.
        `deadline` (time.monotonic()): the call's own timeout; a call still queued then gives up (TimeoutError),
        before the watchdog would take its slot for a wedge."""
        call = _Call(inp, rows)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="learner-sampling", daemon=True)
                self._thread.start()
            self._queue.append(call)
            self._cond.notify_all()
        try:
            while not call.done.wait(wait_step(deadline)):
                if deadline is not None and time.monotonic() >= deadline:
                    if self._drop(call):
                        raise TimeoutError("the sampling call waited for the GPU past its own timeout")
                    deadline = None  # a batch has it: its answer comes soon
                beat({"phase": "sample_actions", "waiting": "for the GPU"})
        except BaseException:
            self._drop(call)
            raise
        if call.error is not None:
            raise call.error
        return call.result, call.batch_calls

    def _drop(self, call: _Call) -> bool:
        """Takes a call that is still waiting off the queue; False when a batch already has it."""
        with self._cond:
            if call in self._queue:
                self._queue.remove(call)
                return True
            return False

    def _take(self) -> list[_Call]:
        """The next batch: calls in arrival order while they fit, the first one always."""
        b = self.batching
        batch: list[_Call] = []
        rows = 0
        for c in list(self._queue):
            if batch and (len(batch) >= b.calls or rows + c.rows > b.rows):
                break
            batch.append(c)
            rows += c.rows
        for c in batch:
            self._queue.remove(c)
        return batch

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                deadline = time.monotonic() + self.batching.window_s
                while len(self._queue) < self.batching.calls and sum(c.rows for c in self._queue) < self.batching.rows:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            with self._gpu:
                with self._cond:
                    batch = self._take()
                if not batch:  # every call waiting was cancelled meanwhile
                    continue
                try:
                    results = self._run([c.inp for c in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"a batch of {len(batch)} sampling calls got {len(results)} answers")
                except BaseException as e:  # noqa: BLE001 - each call of the batch fails with it; the thread goes on
                    results = [e] * len(batch)
            self.batches.append(len(batch))
            for c, r in zip(batch, results):
                if isinstance(r, BaseException):
                    c.error = r
                else:
                    c.result = r
                c.batch_calls = len(batch)
                c.done.set()
