"""Sigmoid DPO: loss formula by hand, logged vs. recomputed references, and the margin grows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from conftest import messages, png_ref
from halo_learner.logprobs import padded_logprobs
from halo_learner.payloads import UpdateDpoInput
from halo_learner.prompts import completion_ids_from_text, encode_prompt


def _seq_logp(policy, prompt, ids):
    with torch.no_grad():
        return float(padded_logprobs(policy, [prompt], [ids], 1.0)[0].sum())


def test_dpo_update_matches_formula_and_raises_margin(learner, blobs):
    policy = learner.policy
    m = messages(png_ref(blobs, 64, 64, 21), "Goal: click the link")
    prompt = encode_prompt(policy.processor, m, blobs)
    chosen, rejected = 'click_element 3', 'scroll down 100'
    ids_c = completion_ids_from_text(policy.tokenizer, prompt.text, chosen, True).ids
    ids_r = completion_ids_from_text(policy.tokenizer, prompt.text, rejected, True).ids
    beta = 0.5
    # Logged reference log-probs (deliberately not the base model's) for one pair, recomputed for another.
    ref_c, ref_r = _seq_logp(policy, prompt, ids_c) + 0.3, _seq_logp(policy, prompt, ids_r) - 0.2
    pi_c, pi_r = _seq_logp(policy, prompt, ids_c), _seq_logp(policy, prompt, ids_r)
    z_logged = beta * ((pi_c - ref_c) - (pi_r - ref_r))
    z_recomputed = 0.0  # adapter starts at B = 0: policy == reference
    expected_loss = (-F.logsigmoid(torch.tensor(z_logged)) - F.logsigmoid(torch.tensor(z_recomputed))) / 2
    batch = blobs.put_json({"pairs": [
        {"prompt": m, "chosen": chosen, "rejected": rejected, "ref_chosen_logprob": ref_c,
         "ref_rejected_logprob": ref_r},
        {"prompt": m, "chosen": chosen, "rejected": rejected, "ref_chosen_logprob": None,
         "ref_rejected_logprob": None},
    ]})
    out = learner.update_dpo(UpdateDpoInput(run_id="dpo", version=1, batch_ref=batch,
                                            hyperparameters={"learning_rate": 5e-3, "beta": beta}))
    print(f"dpo loss {out.loss:.6f} by hand {float(expected_loss):.6f}, margin {out.reward_margin:.4f}")
    assert math.isclose(out.loss, float(expected_loss), rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(out.reward_margin, (z_logged + z_recomputed) / 2, rel_tol=1e-4, abs_tol=1e-6)
    assert out.accuracy == 0.0 + (z_logged > 0) * 0.5
    # After the step the policy prefers the chosen action more than the (base) reference does.
    with policy.model.disable_adapter():
        base_c, base_r = _seq_logp(policy, prompt, ids_c), _seq_logp(policy, prompt, ids_r)
    new_margin = (_seq_logp(policy, prompt, ids_c) - base_c) - (_seq_logp(policy, prompt, ids_r) - base_r)
    assert new_margin > 0.05
