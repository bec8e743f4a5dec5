"""Sigmoid DPO: loss formula by hand, one reference rule (the base model), and the margin grows."""

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
    chosen, rejected = "click_element 3", "scroll down 100"
    ids_c = completion_ids_from_text(policy.tokenizer, prompt.text, chosen, True).ids
    ids_r = completion_ids_from_text(policy.tokenizer, prompt.text, rejected, True).ids
    beta = 0.5
    # Logged reference log-probs (deliberately not the base model's) on one pair: ignored, the base model is
    # the reference of every pair, and the adapter starts at B = 0, so policy == reference: z = 0.
    ref_c, ref_r = _seq_logp(policy, prompt, ids_c) + 0.3, _seq_logp(policy, prompt, ids_r) - 0.2
    z_logged = z_recomputed = 0.0
    expected_loss = (-F.logsigmoid(torch.tensor(z_logged)) - F.logsigmoid(torch.tensor(z_recomputed))) / 2
    batch = blobs.put_json(
        {
            "pairs": [
                {
                    "prompt": m,
                    "chosen": chosen,
                    "rejected": rejected,
                    "ref_chosen_logprob": ref_c,
                    "ref_rejected_logprob": ref_r,
                },
                {
                    "prompt": m,
                    "chosen": chosen,
                    "rejected": rejected,
                    "ref_chosen_logprob": None,
                    "ref_rejected_logprob": None,
                },
            ]
        }
    )
    out = learner.update_dpo(
        UpdateDpoInput(run_id="dpo", version=1, batch_ref=batch, hyperparameters={"learning_rate": 5e-3, "beta": beta})
    )
    print(f"dpo loss {out.loss:.6f} by hand {float(expected_loss):.6f}, margin {out.reward_margin:.4f}")
    assert math.isclose(out.loss, float(expected_loss), rel_tol=1e-5, abs_tol=1e-6)
    assert math.isclose(out.reward_margin, (z_logged + z_recomputed) / 2, rel_tol=1e-4, abs_tol=1e-6)
    assert out.accuracy == 0.0
    # After the step the policy prefers the chosen action more than the (base) reference does.
    with policy.model.disable_adapter():
        base_c, base_r = _seq_logp(policy, prompt, ids_c), _seq_logp(policy, prompt, ids_r)
    new_margin = (_seq_logp(policy, prompt, ids_c) - base_c) - (_seq_logp(policy, prompt, ids_r) - base_r)
    assert new_margin > 0.05


def test_one_reference_rule_logged_references_change_nothing(learner, blobs):
    """A batch whose pairs carry logged references, and the same batch without them, give the loss computed
    with the base model (adapter disabled) as the reference for every pair."""
    from halo_learner.dpo import DpoSample, dpo_step
    from halo_learner.prompts import prompt_key

    policy = learner.policy
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():  # a moved adapter, so policy != base and the reference matters
        for n, p in policy.trainable_parameters().items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    start = {n: p.detach().clone() for n, p in policy.trainable_parameters().items()}
    m = messages(png_ref(blobs, 64, 64, 22), "Goal: open the menu")
    prompt = encode_prompt(policy.processor, m, blobs)
    texts = [("click_element 3", "scroll down 100"), ("type hello", "click_element 9")]
    ids = [
        (
            completion_ids_from_text(policy.tokenizer, prompt.text, c, True).ids,
            completion_ids_from_text(policy.tokenizer, prompt.text, r, True).ids,
        )
        for c, r in texts
    ]
    beta = 0.3
    expected = 0.0
    for c, r in ids:
        pi_c, pi_r = _seq_logp(policy, prompt, c), _seq_logp(policy, prompt, r)
        with policy.model.disable_adapter():
            ref_c, ref_r = _seq_logp(policy, prompt, c), _seq_logp(policy, prompt, r)
        expected += float(-F.logsigmoid(torch.tensor(beta * ((pi_c - ref_c) - (pi_r - ref_r))))) / len(ids)

    def run(logged: list[tuple[float, float] | None]) -> float:
        with torch.no_grad():
            for n, p in policy.trainable_parameters().items():
                p.copy_(start[n])
        learner.optimizer.state.clear()
        samples = [
            DpoSample(
                prompt=prompt,
                prompt_key=prompt_key(m),
                chosen=c,
                rejected=r,
                ref_chosen=lg[0] if lg else None,
                ref_rejected=lg[1] if lg else None,
            )
            for (c, r), lg in zip(ids, logged)
        ]
        return dpo_step(policy, learner.optimizer, samples, beta=beta, max_grad_norm=1.0).loss

    none, mixed, full = run([None, None]), run([(-3.0, -1.0), None]), run([(-3.0, -1.0), (-0.5, -9.0)])
    print(f"dpo loss: no logged refs {none:.6f}, mixed {mixed:.6f}, all logged {full:.6f}, by hand {expected:.6f}")
    for loss in (none, mixed, full):
        assert math.isclose(loss, expected, rel_tol=1e-5, abs_tol=1e-6)
