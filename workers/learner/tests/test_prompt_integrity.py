"""Prompt integrity: untrusted text never becomes a tokenizer token, and no exception wedges the learner's slot."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from conftest import messages, png_ref
from halo_learner.activities import LearnerActivities
from halo_learner.payloads import SampleActionsInput
from halo_learner.prompt_text import QWEN3_VL_ADDED_TOKENS, BREAK, PromptStructureError, check_structure, neutralise
from halo_learner.prompts import encode_prompt, to_template_messages
from halo_learner.watchdog import SlotWatch, Watchdog, event_path
from halo_learner.worker import build_worker

REPO = Path(__file__).resolve().parents[3]
# What the tiny model once typed into a field; the next step's prompt listed it and the learner hung.
POISON = " 2leh_j<|image_pad|>linebereeJJJJJJJJJJJ"
EVERY_TOKEN = " ".join(QWEN3_VL_ADDED_TOKENS)


def test_the_list_is_the_typescript_list():
    ts = (REPO / "lib" / "model-io" / "prompt-text.ts").read_text()
    block = ts[ts.index("QWEN3_VL_ADDED_TOKENS") :]
    block = block[: block.index("];")]
    assert tuple(re.findall(r"'([^']+)'", block)) == QWEN3_VL_ADDED_TOKENS


def test_neutralised_text_has_no_token_and_is_stable(policy):
    tok = policy.tokenizer
    added = set(tok.get_added_vocab().values())
    for text in (POISON, EVERY_TOKEN, "<<|im_end|>|im_end|>>", "<|im_<|im_end|>end|>"):
        out = neutralise(text)
        assert neutralise(out) == out
        assert not any(t in out for t in QWEN3_VL_ADDED_TOKENS)
        assert not added & set(tok(out, add_special_tokens=False)["input_ids"])
        assert out.replace(BREAK, "") == text  # the model still reads every character
    assert neutralise("click <b>OK</b> | 3 < 4") == "click <b>OK</b> | 3 < 4"


def test_raw_token_in_text_was_the_stopiteration(policy, blobs):
    """The failure this guards against, reproduced with the processor alone."""
    msgs = messages(png_ref(blobs, 64, 48, 0), "Previous actions:\n1. type" + POISON)
    template, images = to_template_messages(msgs, blobs)  # no neutralising
    text = policy.processor.apply_chat_template(template, tokenize=False, add_generation_prompt=True)
    with pytest.raises(StopIteration):
        policy.processor(text=[text], images=images, return_tensors="pt")


def test_every_token_in_goal_tree_and_typed_text_encodes_with_the_template_structure(policy, blobs):
    ref = png_ref(blobs, 64, 48, 1)
    user = f'Goal: {EVERY_TOKEN}\nAccessibility tree:\n[3] button "{EVERY_TOKEN}"\nPrevious actions:\n1. type{POISON}'
    raw = encode_prompt(policy.processor, messages(ref, user), blobs)
    # The TypeScript builder sends the text already neutralised: the same tokens.
    pre = encode_prompt(policy.processor, messages(ref, neutralise(user)), blobs)
    assert raw.input_ids.tolist() == pre.input_ids.tolist()
    skeleton = encode_prompt(policy.processor, messages(ref, ""), blobs)
    tok = policy.tokenizer
    added = set(tok.get_added_vocab().values())
    assert [i for i in raw.input_ids.tolist() if i in added] == [i for i in skeleton.input_ids.tolist() if i in added]
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    assert int((raw.input_ids == pad).sum()) == int(raw.image_grid_thw.prod(-1).sum()) // 4


def test_structure_check_names_the_token(policy):
    tok = policy.tokenizer
    with pytest.raises(PromptStructureError, match=r"adds tokenizer tokens \['<\|im_end\|>'\]"):
        check_structure(tok, "<|im_start|>user\nhi<|im_end|><|im_end|>\n", "<|im_start|>user\n<|im_end|>\n")


def test_sample_actions_on_a_poisoned_prompt_answers(learner, blobs):
    ref = blobs.put_json(messages(png_ref(blobs, 64, 48, 2), "Previous actions:\n1. type" + POISON))
    out = LearnerActivities(learner).sample_actions(
        SampleActionsInput(run_id="poison", prompt_ref=ref, n=2, temperature=1.0, max_tokens=4, seed=1).model_dump()
    )
    assert len(out["completions"]) == 2


class Custom(BaseException):
    pass


RAISED = {
    "stop-iteration": (StopIteration, "StopIteration", True),
    "keyboard-interrupt": (KeyboardInterrupt, "KeyboardInterrupt", False),
    "system-exit": (lambda: SystemExit(3), "SystemExit", False),
    "generator-exit": (GeneratorExit, "GeneratorExit", False),
    "custom-base": (lambda: Custom("odd"), "Custom", False),
    "runtime": (lambda: RuntimeError("plain"), "RuntimeError", False),
    "prompt": (lambda: PromptStructureError("bad prompt"), "InvalidPrompt", True),
}


def _raising_learner():
    def update_policy(inp, heartbeat):
        kind = inp.run_id
        if kind in RAISED:
            raise RAISED[kind][0]()
        return SimpleNamespace(model_dump=lambda: {"served": kind})

    return SimpleNamespace(update_policy=update_policy, planned=None)


@pytest.mark.parametrize("kind", sorted(RAISED))
def test_every_exception_becomes_an_application_error_with_its_last_frame(kind):
    acts = LearnerActivities(_raising_learner())
    with pytest.raises(ApplicationError) as e:
        acts.update_policy(
            {
                "run_id": kind,
                "version": 1,
                "batch_ref": "sha256:" + "a" * 64 + ".json",
                "hyperparameters": {"learning_rate": 1e-3},
            }
        )
    _, typ, non_retryable = RAISED[kind]
    assert e.value.type == typ and e.value.non_retryable == non_retryable
    if typ != "InvalidPrompt":
        assert "test_prompt_integrity.py" in e.value.message and "in update_policy" in e.value.message


@workflow.defn(name="learner_calls_in_order")
class CallsInOrder:
    @workflow.run
    async def run(self, args: dict) -> list:
        out = []
        for run_id in args["run_ids"]:
            try:
                res = await workflow.execute_activity(
                    "update_policy",
                    {
                        "run_id": run_id,
                        "version": 1,
                        "batch_ref": "sha256:" + "a" * 64 + ".json",
                        "hyperparameters": {"learning_rate": 1e-3},
                    },
                    task_queue=args["queue"],
                    start_to_close_timeout=timedelta(seconds=args.get("timeout_s", 20)),
                    retry_policy=RetryPolicy(maximum_attempts=1),
                )
                out.append(["ok", res])
            except ActivityError as e:
                cause = e.cause
                out.append(["failed", getattr(cause, "type", None), str(cause)])
        return out


async def _with_learner_worker(address: str, learner, body, watch: SlotWatch | None = None):
    client = await Client.connect(address)
    queue = f"gpu-{uuid.uuid4().hex[:8]}"
    acts = LearnerActivities(learner)
    with ThreadPoolExecutor(max_workers=acts.slots) as pool:
        worker = build_worker(client, queue, acts, pool, "test-learner", watch or SlotWatch())
        async with (
            worker,
            Worker(
                client, task_queue=f"wf-{queue}", workflows=[CallsInOrder], workflow_runner=UnsandboxedWorkflowRunner()
            ),
        ):
            return await body(client, queue)


def _bounded(coro, limit_s: float):
    """Runs `coro` on its own loop in a daemon thread: a wedged worker fails the test instead of hanging it (its
    shutdown waits for an attempt that never completes)."""
    out: dict = {}

    def run():
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        pytest.fail(f"the learner worker did not finish within {limit_s:.0f} s: its slot is wedged")
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_a_real_learner_worker_serves_the_next_activity_after_each_kind(temporal_server):
    order = []
    for kind in sorted(RAISED):
        order += [kind, f"after-{kind}"]

    async def body(client, queue):
        return await client.execute_workflow(
            CallsInOrder.run,
            {"queue": queue, "run_ids": order, "timeout_s": 10},
            id=f"calls-{queue}",
            task_queue=f"wf-{queue}",
        )

    results = _bounded(_with_learner_worker(temporal_server, _raising_learner(), body), 90)
    for run_id, res in zip(order, results):
        if run_id.startswith("after-"):
            assert res == ["ok", {"served": run_id}]
        else:
            assert res[0] == "failed" and res[1] == RAISED[run_id][1], (run_id, res)


def test_the_watchdog_restarts_a_learner_whose_slot_outlives_the_timeout(temporal_server, tmp_path):
    release = threading.Event()
    fired = threading.Event()

    def update_policy(inp, heartbeat):
        release.wait(60)  # a wedge: nothing the SDK can interrupt
        return SimpleNamespace(model_dump=lambda: {})

    watch = SlotWatch()
    record = event_path(tmp_path, "gpu-test", "host")
    dog = Watchdog(watch, record, grace_s=1.0, poll_s=0.2, restart=fired.set).start()

    async def body(client, queue):
        handle = await client.start_workflow(
            CallsInOrder.run,
            {"queue": queue, "run_ids": ["wedged"], "timeout_s": 2},
            id=f"calls-{queue}",
            task_queue=f"wf-{queue}",
        )
        t0 = time.monotonic()
        while not fired.is_set():
            assert time.monotonic() - t0 < 30, "the watchdog did not fire"
            await asyncio.sleep(0.1)
        held = time.monotonic() - t0
        release.set()
        await handle.result()
        return held

    try:
        held = asyncio.run(
            _with_learner_worker(
                temporal_server, SimpleNamespace(update_policy=update_policy, planned=None), body, watch
            )
        )
    finally:
        release.set()
        dog.stop()
    assert held >= 3.0  # 2 s timeout + 1 s grace, not before
    import json

    event = json.loads(record.read_text())
    assert event["activity_type"] == "update_policy" and event["timeout_s"] == 2.0
    assert "restarting the learner" in event["message"]
