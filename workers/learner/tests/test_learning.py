"""Learning, measured: sample -> reward -> dr_grpo update cycles on the tiny model raise the mean reward.

The reward depends on the completion text only: the fraction of its characters that are digits.
"""

from __future__ import annotations

import time

from conftest import messages, png_ref, tokens_ref
from halo_learner.payloads import SampleActionsInput, UpdatePolicyInput

ITERATIONS = 30
GROUP = 8


def digit_fraction(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def test_reward_rises_over_grpo_iterations(learner, blobs):
    prompts = [messages(png_ref(blobs, 96, 64, s), f"Goal: type a number ({s})") for s in range(2)]
    refs = [blobs.put_json(m) for m in prompts]
    history, t0 = [], time.monotonic()
    for it in range(ITERATIONS):
        items, rewards = [], []
        for k, (m, ref) in enumerate(zip(prompts, refs)):
            out = learner.sample_actions(
                SampleActionsInput(
                    run_id="learn",
                    version=it,
                    prompt_ref=ref,
                    n=GROUP,
                    temperature=1.0,
                    max_tokens=8,
                    seed=100 * it + k,
                )
            )
            r = [digit_fraction(c.text) for c in out.completions]
            mean = sum(r) / len(r)
            rewards += r
            # Group-relative advantages, mean-centred without std division (as the workflow computes them).
            items += [
                {
                    "prompt": m,
                    "completion": c.text,
                    "tokens_ref": tokens_ref(blobs, c.token_ids, c.logprobs),
                    "advantage": x - mean,
                }
                for c, x in zip(out.completions, r)
            ]
        history.append(sum(rewards) / len(rewards))
        upd = learner.update_policy(
            UpdatePolicyInput(
                run_id="learn",
                version=it + 1,
                batch_ref=blobs.put_json({"items": items, "max_completion_len": 8}),
                hyperparameters={"learning_rate": 1e-2, "kl_coef": 0.001, "temperature": 1.0},
            )
        )
        assert upd.version == it + 1 and not upd.reused
    start, end = sum(history[:3]) / 3, sum(history[-5:]) / 5
    print(
        f"\nmean reward per iteration ({GROUP} samples x 2 prompts, {time.monotonic() - t0:.1f}s): "
        + " ".join(f"{h:.3f}" for h in history)
    )
    print(f"first 3 iterations: {start:.3f}  last 5 iterations: {end:.3f}")
    assert end > start + 0.15 and end > 3 * start
