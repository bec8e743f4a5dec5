"""Colocated sampling: n completions with log-probs that the trainer reproduces exactly."""

from __future__ import annotations

import torch

from conftest import messages, png_ref
from halo_learner.logprobs import padded_logprobs
from halo_learner.payloads import SampleActionsInput
from halo_learner.prompts import encode_prompt


def test_sample_actions_logprobs_match_training_logprobs(learner, blobs):
    policy = learner.policy
    m = messages(png_ref(blobs, 128, 72, 31), "Goal: open the menu")
    ref = blobs.put_json(m)
    inp = SampleActionsInput(run_id="s", version=0, prompt_ref=ref, n=5, temperature=0.8, max_tokens=12, seed=7)
    out = learner.sample_actions(inp)
    assert len(out.completions) == 5 and out.model == "tiny-random" and out.version == 0
    prompt = encode_prompt(policy.processor, m, blobs)
    for c in out.completions:
        assert len(c.token_ids) == len(c.logprobs) >= 1
        assert (c.finish_reason == "length") == (len(c.token_ids) == 12)
        with torch.no_grad():
            lp, _ = padded_logprobs(policy, [prompt], [c.token_ids], 0.8)
        assert torch.allclose(lp[0], torch.tensor(c.logprobs), atol=1e-4)
    again = learner.sample_actions(inp)
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in out.completions]  # seeded


def test_greedy_is_deterministic(learner, blobs):
    ref = blobs.put_json(messages(None, "Goal: text only prompt"))
    inp = dict(run_id="s", version=0, prompt_ref=ref, n=3, temperature=0.0, max_tokens=6)
    out = learner.sample_actions(SampleActionsInput(**inp))
    assert len({tuple(c.token_ids) for c in out.completions}) == 1
