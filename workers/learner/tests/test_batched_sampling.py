"""Sampling calls that arrive together run as one batch, and each call gets what it would have sampled alone."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from conftest import messages, png_ref
from halo_learner import sample_batcher
from halo_learner.activities import LearnerActivities
from halo_learner.blobs import BlobNotFound
from halo_learner.payloads import SampleActionsInput
from halo_learner.sample_batcher import Batching, SampleBatcher
from halo_learner.watchdog import SlotWatch
from halo_learner.worker import build_worker

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())


def _inputs(blobs) -> list[SampleActionsInput]:
    """Calls unlike each other: prompt and image sizes, n, temperature (greedy too), max_tokens, seed, a grammar."""
    grammar = blobs.put_json(SCHEMA)
    shapes = [
        (128, 72, "Goal: open the menu", 3, 0.8, 12, 7, None),
        (64, 48, "Goal: type hello into the second field of the form below, then press submit", 2, 1.0, 9, 11, None),
        (None, None, "Goal: text only", 1, 0.0, 6, None, None),
        (96, 64, "Goal: click the button", 4, 1.0, 128, 5, grammar),
    ]
    out = []
    for i, (w, h, goal, n, temp, max_tokens, seed, grammar_ref) in enumerate(shapes):
        image = png_ref(blobs, w, h, 40 + i) if w else None
        out.append(
            SampleActionsInput(
                run_id="batch",
                prompt_ref=blobs.put_json(messages(image, goal)),
                n=n,
                temperature=temp,
                max_tokens=max_tokens,
                seed=seed,
                grammar_ref=grammar_ref,
            )
        )
    return out


def _same(alone, batched) -> None:
    assert len(alone.completions) == len(batched.completions)
    for a, b in zip(alone.completions, batched.completions):
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_a_batch_samples_what_each_call_samples_alone(learner, blobs):
    inps = _inputs(blobs)
    alone = [learner.sample_actions(i) for i in inps]
    batched = learner.sample_many(inps)
    for i, (a, b) in enumerate(zip(alone, batched)):
        assert not isinstance(b, BaseException), (i, b)
        _same(a, b)
    # The grammar row's completions are actions, the others free text: each row kept its own constraint.
    assert all(json.loads(c.text)["name"] == "computer_use" for c in batched[3].completions)
    # Not all alike: the calls really sampled (the seeded ones differ from each other).
    assert len({tuple(c.token_ids) for b in batched for c in b.completions}) > 3


def test_a_call_that_fails_fails_alone(learner, blobs):
    good, *_ = _inputs(blobs)
    missing = good.model_copy(update={"prompt_ref": "sha256:" + "0" * 64 + ".json"})
    other_model = good.model_copy(update={"base_model": "Qwen/Qwen3-VL-8B-Instruct"})
    out = learner.sample_many([missing, good, other_model])
    assert isinstance(out[0], BlobNotFound)
    assert isinstance(out[2], Exception) and "Qwen/Qwen3-VL-8B-Instruct" in str(out[2])
    _same(learner.sample_actions(good), out[1])


def _submit_all(batcher: SampleBatcher, rows: list[int]) -> list:
    out: list = [None] * len(rows)

    def call(i: int) -> None:
        try:
            out[i] = batcher.submit(f"call-{i}", rows[i], lambda d: None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(rows))]
    for t in threads:
        t.start()
        time.sleep(0.005)
    for t in threads:
        t.join(10)
    return out


def test_calls_arriving_together_are_one_batch_within_the_limits():
    seen: list[list[str]] = []
    batcher = SampleBatcher(
        lambda inps: seen.append(inps) or [f"answer to {i}" for i in inps],
        threading.Lock(),
        Batching(calls=3, rows=8, window_s=0.3),
    )
    out = _submit_all(batcher, [2, 2, 2, 2])
    # Three calls (the call limit), then the fourth; each call gets its own answer and its batch's size.
    assert seen == [["call-0", "call-1", "call-2"], ["call-3"]]
    assert out == [("answer to call-0", 3), ("answer to call-1", 3), ("answer to call-2", 3), ("answer to call-3", 1)]
    seen.clear()
    out = _submit_all(batcher, [5, 3, 1, 9])
    # The row limit: 5 + 3 fit in 8; the next batch holds 1 (9 more would not fit); a call over the limit runs alone.
    assert seen == [["call-0", "call-1"], ["call-2"], ["call-3"]]
    assert batcher.batches == [3, 1, 2, 1, 1]


def test_calls_wait_for_an_update_and_then_run_together(monkeypatch):
    monkeypatch.setattr(sample_batcher, "WAIT_BEAT_S", 0.05)
    gpu = threading.Lock()
    seen: list[list[str]] = []
    batcher = SampleBatcher(lambda inps: seen.append(inps) or inps, gpu, Batching(calls=8, rows=64, window_s=0.0))
    beats: list[dict] = []
    cancelled = SimpleNamespace(done=False)

    def cancelled_beat(d: dict) -> None:
        beats.append(d)
        if not cancelled.done:
            cancelled.done = True
            raise RuntimeError("cancelled")  # as the SDK interrupts a cancelled activity's thread

    with gpu:  # an update holds the GPU
        results: dict = {}

        def call(name: str, beat) -> None:
            try:
                results[name] = batcher.submit(name, 1, beat)
            except BaseException as e:  # noqa: BLE001
                results[name] = e

        threads = [threading.Thread(target=call, args=(f"c{i}", lambda d: None)) for i in range(3)]
        threads.append(threading.Thread(target=call, args=("gone", cancelled_beat)))
        for t in threads:
            t.start()
        time.sleep(0.5)
        assert seen == [] and beats and beats[0]["waiting"] == "for the GPU"
    for t in threads:
        t.join(10)
    assert isinstance(results["gone"], RuntimeError), "the cancelled call left with its own error"
    # The first call may have been taken alone before the others arrived; the rest waited and ran together.
    ran = [x for b in seen for x in b]
    assert sorted(ran) == ["c0", "c1", "c2"] and len(seen) <= 2
    assert all(results[f"c{i}"][0] == f"c{i}" for i in range(3))


def test_a_call_still_waiting_at_its_timeout_gives_up_and_leaves_the_queue(monkeypatch):
    monkeypatch.setattr(sample_batcher, "WAIT_BEAT_S", 0.05)
    gpu = threading.Lock()
    seen: list[list[str]] = []
    batcher = SampleBatcher(lambda inps: seen.append(inps) or inps, gpu, Batching(calls=8, rows=64, window_s=0.0))
    with gpu:  # an update holds the GPU past the call's timeout
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="past its own timeout"):
            batcher.submit("late", 1, lambda d: None, deadline=time.monotonic() + 0.3)
        assert 0.25 < time.monotonic() - t0 < 2.0
    assert batcher.submit("next", 1, lambda d: None, deadline=time.monotonic() + 5) == ("next", 1)
    assert seen == [["next"]], "the call that gave up was never sampled"


def test_an_update_waiting_for_the_gpu_past_its_timeout_gives_up(learner, monkeypatch):
    acts = LearnerActivities(learner)
    monkeypatch.setattr("halo_learner.activities._deadline", lambda: time.monotonic() + 0.3)
    with acts._gpu:  # a sampling batch (or another update) holds the GPU
        with pytest.raises(TimeoutError):
            with acts._held(True):
                pass
    with acts._held(True):
        assert acts._gpu.locked()
    assert not acts._gpu.locked()


def test_a_failing_batch_fails_each_of_its_calls_and_the_next_batch_runs():
    calls = SimpleNamespace(n=0)

    def run(inps):
        calls.n += 1
        if calls.n == 1:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return inps

    batcher = SampleBatcher(run, threading.Lock(), Batching(calls=4, rows=8, window_s=0.3))
    out = _submit_all(batcher, [1, 1])
    assert all(isinstance(o, torch.OutOfMemoryError) for o in out)
    assert _submit_all(batcher, [1]) == [("call-0", 1)]


def test_batching_settings_from_the_environment():
    assert Batching.from_env({}, cuda=True) == Batching(calls=8, rows=32, window_s=0.02)
    assert Batching.from_env({}, cuda=False) == Batching(calls=1, rows=32, window_s=0.02), "no batching on the CPU"
    env = {"HALO_SAMPLE_BATCH": "1", "HALO_SAMPLE_BATCH_ROWS": "16", "HALO_SAMPLE_WINDOW_MS": "0"}
    assert Batching.from_env(env, cuda=True) == Batching(calls=1, rows=16, window_s=0.0)
    assert Batching.from_env({"HALO_SAMPLE_BATCH": "4"}, cuda=False).calls == 4
    for name, bad in [("HALO_SAMPLE_BATCH", "0"), ("HALO_SAMPLE_BATCH_ROWS", "many"), ("HALO_SAMPLE_WINDOW_MS", "-1")]:
        with pytest.raises(ValueError, match=name):
            Batching.from_env({name: bad})


@workflow.defn(name="samples_at_once")
class SamplesAtOnce:
    @workflow.run
    async def run(self, args: dict) -> list:
        return await asyncio.gather(
            *[
                workflow.execute_activity(
                    "sample_actions",
                    inp,
                    task_queue=args["queue"],
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
                for inp in args["inputs"]
            ]
        )


def test_concurrent_sample_activities_of_a_real_worker_are_one_batch(temporal_server, learner, blobs):
    inps = _inputs(blobs)
    alone = [learner.sample_actions(i) for i in inps]
    acts = LearnerActivities(learner, batching=Batching(calls=4, rows=32, window_s=0.5))

    async def main():
        client = await Client.connect(temporal_server)
        queue = f"gpu-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(max_workers=acts.slots) as pool:
            async with (
                build_worker(client, queue, acts, pool, "test-learner", SlotWatch()),
                Worker(
                    client,
                    task_queue=f"wf-{queue}",
                    workflows=[SamplesAtOnce],
                    workflow_runner=UnsandboxedWorkflowRunner(),
                ),
            ):
                return await client.execute_workflow(
                    SamplesAtOnce.run,
                    {"queue": queue, "inputs": [i.model_dump() for i in inps]},
                    id=f"samples-{queue}",
                    task_queue=f"wf-{queue}",
                )

    out = asyncio.run(main())
    assert acts.slots == 4
    assert [o["batch_calls"] for o in out] == [4, 4, 4, 4], "the four calls were sampled as one batch"
    assert acts.batcher.batches == [4]
    for a, o in zip(alone, out):
        _same(a, SimpleNamespace(completions=[SimpleNamespace(**c) for c in o["completions"]]))
