"""Served samples: the sampler's log-probs come from another engine, so even a fresh sample's ratio to them is not 1.
Clipped against them, the tokens the engines disagree on most lose their gradient; the decoupled objective clips to
the learner's own log-probs instead and weights each token by (capped) learner / sampler."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from conftest import messages, png_ref, tokens_ref
from halo_learner import adapters
from halo_learner.grpo import GrpoSample, grpo_step
from halo_learner.logprobs import padded_logprobs
from halo_learner.payloads import UpdatePolicyInput
from halo_learner.prompts import encode_prompt, prompt_key

# The sampler's log-probs sit SHIFT below the learner's on every token (ratio e^0.5 = 1.65, outside [0.8, 1.2]): an
# engine mismatch far larger than bf16 noise, so the two objectives part clearly.
SHIFT = 0.5


def _sample(policy, blobs, seed: int) -> GrpoSample:
    m = messages(png_ref(blobs, 64, 64, seed), "Goal: press OK")
    prompt = encode_prompt(policy.processor, m, blobs)
    rnd = random.Random(seed)
    ids = [rnd.randrange(10, len(policy.tokenizer)) for _ in range(4)]
    with torch.no_grad():
        cur = padded_logprobs(policy, [prompt], [ids], 1.0)[0][0].tolist()
    return GrpoSample(prompt, prompt_key(m), ids, 1.0, [lp - SHIFT for lp in cur])


def _step(learner, sample, **kw):
    return grpo_step(
        learner.policy,
        learner.optimizer,
        [sample],
        clip_epsilon=0.2,
        kl_coef=0.0,
        temperature=1.0,
        max_grad_norm=1.0,
        max_completion_len=4,
        micro_batch=1,
        **kw,
    )


@pytest.mark.parametrize("cap, weight", [(2.0, math.exp(SHIFT)), (1.5, 1.5)])
def test_the_decoupled_objective_keeps_every_tokens_gradient(learner, blobs, cap, weight):
    plain = _step(learner, _sample(learner.policy, blobs, 4))
    # Every ratio to the sampler is 1.65 with a positive advantage: all clipped, no gradient at all.
    assert plain.ratios.clip_fraction == 1.0 and plain.grad_norm == 0.0
    assert math.isclose(plain.loss, -1.2 * 4 / 4, rel_tol=1e-5)

    dec = _step(learner, _sample(learner.policy, blobs, 4), weight_cap=cap)
    r = dec.ratios
    print(f"decoupled cap {cap}: loss {dec.loss:.5f} grad_norm {dec.grad_norm:.4f} |log-ratio| {r.mean_abs_log_ratio}")
    # Nothing clipped before the step (the ratio to the proximal policy is 1), the weight is learner / sampler.
    assert r.clip_fraction == 0.0 and dec.grad_norm > 0.0
    assert math.isclose(dec.loss, -weight * 4 / 4, rel_tol=1e-4)
    assert math.isclose(r.mean_abs_log_ratio, SHIFT, rel_tol=1e-4)
    assert r.capped_fraction == (1.0 if cap < math.exp(SHIFT) else 0.0)


def test_update_policy_reports_the_served_ratio_statistics(learner, blobs):
    s = _sample(learner.policy, blobs, 6)
    m = messages(png_ref(blobs, 64, 64, 6), "Goal: press OK")
    item = {"prompt": m, "completion": "x", "tokens_ref": tokens_ref(blobs, s.ids, s.old_logprobs), "advantage": 1.0}
    hp = {"kl_coef": 0.0, "temperature": 1.0, "stale_weight_cap": 5.0}
    out = learner.update_policy(
        UpdatePolicyInput(run_id="served", version=1, batch_ref=blobs.put_json({"items": [item]}), hyperparameters=hp)
    )
    metrics = adapters.read_manifest(Path(out.adapter_path))["metrics"]
    assert out.clip_fraction == 0.0 and out.ratio_tokens == 4
    assert math.isclose(metrics["mean_abs_log_ratio"], SHIFT, rel_tol=1e-3)
    assert metrics["capped_fraction"] == 0.0 and metrics["hyperparameters"]["stale_weight_cap"] == 5.0
