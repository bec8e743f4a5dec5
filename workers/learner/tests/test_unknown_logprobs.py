"""Unknown sampler log-probs (vLLM's -9999 placeholder, or a null entry): the update drops that position from the
loss, counts it and warns; a row without any sampler log-probs is still trained (ratio 1); DPO, which reads no
sampler log-probs, takes such blobs as they are."""

from __future__ import annotations

import logging
import math
import random

import pytest
import torch

from conftest import messages, png_ref, tokens_ref
from halo_learner.grpo import GrpoSample, grpo_step
from halo_learner.logprobs import padded_logprobs
from halo_learner.payloads import SampledTokens, UpdateDpoInput, UpdatePolicyInput
from halo_learner.prompts import encode_prompt, prompt_key


def test_null_and_placeholder_entries_are_unknown_and_counted():
    t = SampledTokens.model_validate_json('{"token_ids": [5, 6, 7, 8], "logprobs": [-0.5, null, -9999.0, -12000]}')
    assert t.known_logprobs() == ([-0.5, None, None, None], 3)
    assert SampledTokens(token_ids=[1]).known_logprobs() == (None, 0)
    assert SampledTokens(token_ids=[1, 2], logprobs=[-0.1, -9998.5]).known_logprobs() == ([-0.1, -9998.5], 0)


def test_an_unknown_position_is_dropped_from_the_loss(learner, blobs):
    policy = learner.policy
    m = messages(png_ref(blobs, 64, 64, 3), "Goal: press OK")
    prompt = encode_prompt(policy.processor, m, blobs)
    rnd = random.Random(1)
    ids = [rnd.randrange(10, len(policy.tokenizer)) for _ in range(4)]
    T, adv, Lmax, shift = 1.0, 1.0, 4, 0.1
    with torch.no_grad():
        cur = padded_logprobs(policy, [prompt], [ids], T)[0][0].tolist()
    # Known positions sit `shift` below the policy (ratio e^shift, inside the clip range); position 1 is unknown.
    old = [lp - shift for lp in cur]
    old[1] = None
    key = prompt_key(m)
    partly = GrpoSample(prompt=prompt, prompt_key=key, ids=ids, advantage=adv, old_logprobs=old)
    # A row the server gave no log-probs for at all: plain policy gradient on every token.
    none = GrpoSample(prompt=prompt, prompt_key=key, ids=ids, advantage=adv, old_logprobs=None)
    stats = grpo_step(
        policy,
        learner.optimizer,
        [partly, none],
        clip_epsilon=0.2,
        kl_coef=0.0,
        temperature=T,
        max_grad_norm=1.0,
        max_completion_len=Lmax,
        micro_batch=2,
    )
    expected = -adv * (3 * math.exp(shift) + 4 * 1.0) / (2 * Lmax)
    print(f"loss {stats.loss:.8f}, by hand {expected:.8f}")
    assert abs(stats.loss - expected) < 1e-5
    assert stats.ratios.tokens == 3  # the unknown position is not a ratio token
    assert abs(stats.ratios.mean_ratio - math.exp(shift)) < 1e-4


def _update(learner, blobs, run_id, items, version=1):
    return learner.update_policy(
        UpdatePolicyInput(
            run_id=run_id, version=version, batch_ref=blobs.put_json({"items": items}), hyperparameters={"kl_coef": 0.0}
        )
    )


def test_a_batch_with_unknown_entries_runs_counts_and_warns(learner, blobs, caplog):
    m = messages(None, "Goal: type hello")
    V = len(learner.policy.tokenizer)
    rnd = random.Random(2)
    a, b = [rnd.randrange(10, V) for _ in range(5)], [rnd.randrange(10, V) for _ in range(3)]
    items = [
        {
            "prompt": m,
            "completion": "x",
            "tokens_ref": tokens_ref(blobs, a, [-1.0, None, -2.0, None, -0.5]),
            "advantage": 1.0,
        },
        # Written before null entries existed: vLLM's clamped -inf is a number, and unknown all the same.
        {"prompt": m, "completion": "y", "tokens_ref": tokens_ref(blobs, b, [-9999.0, -1.5, -0.2]), "advantage": -1.0},
    ]
    with caplog.at_level(logging.WARNING, logger="halo_learner"):
        out = _update(learner, blobs, "unknown", items)
    warned = [r.getMessage() for r in caplog.records if "no log-prob" in r.getMessage()]
    assert warned == [
        "3 sampler tokens in 2 of 2 items have no log-prob (vLLM's -9999 placeholder or none reported, first in "
        "items[0]): dropped from the loss"
    ]
    from pathlib import Path

    from halo_learner import adapters

    metrics = adapters.read_manifest(Path(out.adapter_path))["metrics"]
    assert out.unknown_logprobs == 3 and metrics["unknown_logprobs"] == 3
    assert out.ratio_tokens == len(a) + len(b) - 3
    assert math.isfinite(out.loss) and math.isfinite(out.grad_norm)
    assert out.prompt_mismatch_rate is None  # no prompt ids to compare with: no rate, not a perfect one
    again = _update(learner, blobs, "unknown", items)  # the retry of a written version reports the same counts
    assert again.reused and again.unknown_logprobs == 3


def test_dpo_takes_token_blobs_with_unknown_entries(learner, blobs):
    m = messages(None, "Goal: choose")
    V = len(learner.policy.tokenizer)
    rnd = random.Random(3)
    chosen, rejected = [rnd.randrange(10, V) for _ in range(3)], [rnd.randrange(10, V) for _ in range(4)]
    pair = {
        "prompt": m,
        "chosen": "a",
        "rejected": "b",
        "chosen_tokens_ref": tokens_ref(blobs, chosen, [None, -1.0, -9999.0]),
        "rejected_tokens_ref": tokens_ref(blobs, rejected, [None] * 4),
    }
    out = learner.update_dpo(
        UpdateDpoInput(run_id="dpo-unknown", version=1, batch_ref=blobs.put_json({"pairs": [pair]}))
    )
    assert out.tokens == len(chosen) + len(rejected) and math.isfinite(out.loss)


@pytest.mark.parametrize("logprobs", [[-1.0, "x"], [-1.0]])
def test_a_malformed_log_prob_list_is_still_refused(learner, blobs, logprobs):
    from halo_learner.batches import InvalidBatch

    m = messages(None, "Goal: x")
    ref = blobs.put_json({"token_ids": [11, 12], "logprobs": logprobs})
    with pytest.raises(InvalidBatch, match=r"items\[0\]\.tokens_ref"):
        _update(learner, blobs, "bad-lp", [{"prompt": m, "completion": "x", "tokens_ref": ref, "advantage": 1.0}])
