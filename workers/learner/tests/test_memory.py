"""Chunk-size planning under a memory budget, and an out-of-memory retry that shrinks instead of repeating."""

from __future__ import annotations

import random

import pytest
import torch
from temporalio.exceptions import ApplicationError

from conftest import messages, png_ref, tokens_ref
from halo_learner.activities import LearnerActivities
from halo_learner.memory import GIB, HEADROOM_BYTES, MemoryModel, OomHints, plan_micro_batch

# The 8B's shape: ~17 GiB resident, ~8 MB of activations per packed token, a 151,936-entry vocabulary.
EIGHT_B = MemoryModel(resident_bytes=int(17.0 * GIB), act_bytes_per_token=58.0 * 4096 * 36, vocab=151936)
SCREENSHOT_PROMPT = 1000  # 880 image tokens + the text of the prompt


def test_real_config_shape_fits_the_budget_vllm_leaves():
    """8 groups x 8 completions of up to 256 tokens, on an 80 GB card beside vLLM at 0.5 (~40 GiB)."""
    groups = [(SCREENSHOT_PROMPT, [256] * 8) for _ in range(8)]
    budget = 40 * GIB
    plan = plan_micro_batch(groups, cap=8, budget=budget, model=EIGHT_B)
    print(f"micro-batch {plan.micro_batch}, estimated peak {plan.peak_bytes / GIB:.1f} GiB of {budget / GIB:.0f}")
    assert plan.fits and plan.peak_bytes + HEADROOM_BYTES <= budget
    assert 1 <= plan.micro_batch < 8  # all 8 in one packed sequence would not fit
    bigger = plan_micro_batch(groups, cap=8, budget=budget, model=EIGHT_B)
    assert bigger == plan  # deterministic: a retry plans the same unless a hint says otherwise
    one_more = EIGHT_B.chunk_bytes(
        SCREENSHOT_PROMPT + (plan.micro_batch + 1) * 255 + 16, (plan.micro_batch + 1) * 255 + 1
    )
    assert one_more + HEADROOM_BYTES > budget  # the largest size that fits, not a smaller one


def test_plan_follows_the_batch_not_a_fixed_size():
    short = [(SCREENSHOT_PROMPT, [30] * 8) for _ in range(8)]
    long = [(SCREENSHOT_PROMPT, [256] * 8) for _ in range(8)]
    a = plan_micro_batch(short, cap=8, budget=40 * GIB, model=EIGHT_B)
    b = plan_micro_batch(long, cap=8, budget=40 * GIB, model=EIGHT_B)
    assert a.micro_batch == 8 and b.micro_batch < 8
    assert plan_micro_batch(long, cap=8, budget=None, model=EIGHT_B).micro_batch == 8  # no budget: the cap
    assert plan_micro_batch(long, cap=2, budget=40 * GIB, model=EIGHT_B).micro_batch <= 2
    # The padded path repeats the prompt per row, so it fits fewer rows than the packed one.
    padded = plan_micro_batch(long, cap=8, budget=40 * GIB, model=EIGHT_B, packed=False)
    assert padded.micro_batch < b.micro_batch
    hopeless = plan_micro_batch(long, cap=8, budget=18 * GIB, model=EIGHT_B)
    assert hopeless.micro_batch == 1 and not hopeless.fits


def test_oom_hints_halve_per_batch(tmp_path):
    hints = OomHints(tmp_path / "h.json")
    assert hints.cap("a") is None
    assert hints.shrink("a", 8) == 4 and hints.cap("a") == 4
    assert hints.shrink("a", 4) == 2 and hints.shrink("a", 2) == 1
    assert hints.shrink("a", 1) is None  # one row already failed: nothing smaller to try
    assert OomHints(tmp_path / "h.json").cap("a") == 1 and hints.cap("b") is None  # persisted, per batch


def test_oom_retry_runs_a_smaller_micro_batch(learner, blobs, monkeypatch):
    """The first attempt runs out of memory at 4 completions per chunk; the retry plans 2 and succeeds."""
    import halo_learner.learner as learner_mod

    m = messages(png_ref(blobs, 64, 64, 41), "Goal: archive the mail")
    rnd = random.Random(3)
    ref = blobs.put_json(
        {
            "items": [
                {
                    "prompt": m,
                    "completion": "",
                    "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(4)]),
                    "advantage": a,
                }
                for a in (0.5, -0.5, 0.25, -0.25)
            ],
            "max_completion_len": 8,
        }
    )
    seen = []
    real_step = learner_mod.grpo_step

    def step(*a, **k):
        seen.append(k["micro_batch"])
        if k["micro_batch"] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real_step(*a, **k)

    monkeypatch.setattr(learner_mod, "grpo_step", step)
    acts = LearnerActivities(learner)
    raw = {"run_id": "oom", "version": 1, "batch_ref": ref, "hyperparameters": {"learning_rate": 1e-3}}
    with pytest.raises(ApplicationError) as e:
        acts.update_policy(raw)
    assert not e.value.non_retryable and e.value.type == "OutOfMemory" and "micro-batch 2" in e.value.message
    out = acts.update_policy(raw)
    assert seen == [4, 2] and out["micro_batch"] == 2 and not out["reused"]


def test_oom_at_one_row_is_permanent(learner, blobs, monkeypatch):
    import halo_learner.learner as learner_mod

    m = messages(None, "Goal: x")
    ref = blobs.put_json(
        {
            "items": [{"prompt": m, "completion": "", "tokens_ref": tokens_ref(blobs, [20, 21]), "advantage": 1.0}],
            "max_completion_len": 8,
        }
    )

    def step(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(learner_mod, "grpo_step", step)
    acts = LearnerActivities(learner)
    with pytest.raises(ApplicationError) as e:
        acts.update_policy({"run_id": "oom1", "version": 1, "batch_ref": ref})
    assert e.value.non_retryable and "one completion per chunk" in e.value.message
