"""Sigmoid DPO: loss formula by hand, one reference rule (the base model), and the margin grows."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

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


# ---- packed vs. padded, exact tokens, grammar masks ------------------------------------------------------------


def _perturb(policy, seed=3, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.trainable_parameters().items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _random_bitmask(ids: list[int], vocab: int, g: torch.Generator) -> torch.Tensor:
    """A grammar-like mask: about a third of the vocabulary allowed per position, the sampled token always, some
    positions forced (only the sampled token allowed)."""
    allowed = torch.rand((len(ids), vocab), generator=g) < 0.35
    for t, tok in enumerate(ids):
        if t % 3 == 2:
            allowed[t] = False
        allowed[t, tok] = True
    words = -(-vocab // 32)
    bits = F.pad(allowed, (0, words * 32 - vocab)).view(len(ids), words, 32).long()
    packed = (bits << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _pairs(policy, blobs, constrained: bool):
    """Two prompts, 3 + 2 pairs in interleaved batch order, completions of unequal lengths."""
    from halo_learner.dpo import DpoSample
    from halo_learner.prompts import prompt_key

    vocab = policy.model.get_output_embeddings().out_features
    rnd, g = random.Random(5), torch.Generator().manual_seed(5)
    prompts = []
    for seed, goal in ((41, "Goal: click the OK button"), (42, "Goal: type hello, then submit")):
        m = messages(png_ref(blobs, 96, 64, seed), goal)
        prompts.append((prompt_key(m), encode_prompt(policy.processor, m, blobs)))
    samples = []
    for i, (nc, nr) in enumerate([(5, 3), (2, 7), (6, 6), (1, 4), (8, 2)]):
        key, prompt = prompts[0] if i in (0, 2, 4) else prompts[1]
        c = [rnd.randrange(10, vocab) for _ in range(nc)]
        r = [rnd.randrange(10, vocab) for _ in range(nr)]
        masks = (_random_bitmask(c, vocab, g), _random_bitmask(r, vocab, g) if i != 3 else None)
        samples.append(
            DpoSample(
                prompt=prompt,
                prompt_key=key,
                chosen=c,
                rejected=r,
                chosen_bitmask=masks[0] if constrained else None,
                rejected_bitmask=masks[1] if constrained else None,
            )
        )
    return samples


def _textbook_grads(policy, samples, beta):
    """The DPO loss of the whole batch from one left/right-padded batch per pass, differentiated by autograd."""
    prompts = [s.prompt for s in samples for _ in (0, 1)]
    ids = [t for s in samples for t in (s.chosen, s.rejected)]
    masks = [b for s in samples for b in (s.chosen_bitmask, s.rejected_bitmask)]
    policy.model.zero_grad(set_to_none=True)
    with torch.no_grad(), policy.model.disable_adapter():
        lp, m = padded_logprobs(policy, prompts, ids, 1.0, masks)
        ref = (lp * m).sum(1).view(-1, 2)
    lp, m = padded_logprobs(policy, prompts, ids, 1.0, masks)
    pi = (lp * m).sum(1).view(-1, 2)
    z = beta * ((pi[:, 0] - ref[:, 0]) - (pi[:, 1] - ref[:, 1]))
    loss = -F.logsigmoid(z).mean()
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.flatten() for p in policy.trainable_parameters().values()])


def _dpo_grads(policy, samples, beta, packed, cap, checkpointed: bool | int = False):
    """Loss, gradient, plan, and per decoder layer how often it ran (`checkpointed`: its first n layers, True: all)."""
    from halo_learner.dpo import dpo_backward, plan_chunks

    policy.model.zero_grad(set_to_none=True)
    plan = plan_chunks(policy, samples, cap, packed)
    n = plan.decoder_layers if checkpointed is True else int(checkpointed)
    for g in plan.groups:
        g.layers = [n] * len(g.chunks) if n else None
    layers = policy.model.base_model.model.model.language_model.layers
    calls = [0] * len(layers)

    def counted(i, forward):
        def run(*a, **k):  # a forward hook would not see the checkpoint's recompute
            calls[i] += 1
            return forward(*a, **k)

        return run

    for i, layer in enumerate(layers):
        layer.forward = counted(i, layer.forward)
    try:
        out = dpo_backward(policy, samples, beta=beta, plan=plan, packed=packed)
    finally:
        for layer in layers:
            del layer.forward
    grads = torch.cat([p.grad.flatten() for p in policy.trainable_parameters().values()])
    return out.loss, grads, plan, calls


def test_packed_dpo_gradients_equal_the_padded_computation(policy, blobs):
    """float32: the packed step (prompt once per chunk with its pairs packed after it; whole prompt groups or
    chunks of them; with and without gradient checkpointing; grammar masks on most completions) gives the
    gradient of the textbook padded batch and of the unpacked step."""
    _perturb(policy)
    beta = 0.5
    samples = _pairs(policy, blobs, constrained=True)
    loss_t, g_t = _textbook_grads(policy, samples, beta)
    assert g_t.norm() > 0
    runs = {
        "padded (group_logprobs)": _dpo_grads(policy, samples, beta, False, 2),
        "packed, whole groups": _dpo_grads(policy, samples, beta, True, 8),
        "packed, whole groups, checkpointed": _dpo_grads(policy, samples, beta, True, 8, checkpointed=True),
        "packed, one pair per chunk": _dpo_grads(policy, samples, beta, True, 1),
        "packed, two pairs per chunk, checkpointed": _dpo_grads(policy, samples, beta, True, 2, checkpointed=True),
        "packed, whole groups, first layer checkpointed": _dpo_grads(policy, samples, beta, True, 8, checkpointed=1),
    }
    assert [len(g.chunks) for g in runs["packed, whole groups"][2].groups] == [1, 1]
    assert [len(g.chunks) for g in runs["packed, two pairs per chunk, checkpointed"][2].groups] == [2, 1]
    # Per chunk each layer runs for the reference and the gradient pass, and once more when checkpointed: the first
    # n layers only, when the plan checkpoints n of them.
    assert runs["packed, whole groups"][3] == [2 * 2, 2 * 2]
    assert runs["packed, whole groups, checkpointed"][3] == [3 * 2, 3 * 2]
    assert runs["packed, whole groups, first layer checkpointed"][3] == [3 * 2, 2 * 2]
    for name, (loss, g, _, _) in runs.items():
        diff = float((g - g_t).abs().max())
        rel = float((g - g_t).norm() / g_t.norm())
        print(
            f"{name}: loss {loss:.8f} vs {loss_t:.8f}, max abs grad diff {diff:.2e} "
            f"(largest gradient entry {float(g_t.abs().max()):.2e}), relative {rel:.2e}"
        )
        assert abs(loss - loss_t) < 1e-6
        assert rel < 1e-4 and diff < 1e-4 * float(g_t.abs().max())
    # The comparison sees the masks: the same pairs scored without them give another gradient.
    _, g_u, _, _ = _dpo_grads(policy, _pairs(policy, blobs, constrained=False), beta, True, 8)
    rel_u = float((g_u - g_t).norm() / g_t.norm())
    print(f"packed without the grammar masks: relative grad difference {rel_u:.2e}")
    assert rel_u > 1e-2


def _manifest(out) -> dict:
    from pathlib import Path

    from halo_learner import adapters

    return adapters.read_manifest(Path(out.adapter_path))["metrics"]


def test_update_scores_the_samplers_tokens_under_their_grammar(learner, blobs):
    """Pairs with token references are scored on the sampler's ids (not the pair's text), under the grammar their
    blob names: the policy's log-prob of a completion is the sampler's own (v0 samples, v0 scores, temperature 1).
    Pairs without references are retokenised and counted."""
    from halo_learner.payloads import SampleActionsInput

    schema = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())
    m = messages(png_ref(blobs, 96, 64, 51), "Goal: click the button")
    grammar_ref = blobs.put_json(schema)
    out = learner.sample_actions(
        SampleActionsInput(
            run_id="dpo-tok",
            version=0,
            prompt_ref=blobs.put_json(m),
            n=4,
            temperature=1.0,
            max_tokens=128,
            seed=3,
            grammar_ref=grammar_ref,
            store_tokens=True,
        )
    )
    c = out.completions
    assert all(blobs.get_json(x.tokens_ref)["grammar_ref"] == grammar_ref for x in c)
    pairs = [
        {"prompt": m, "chosen": "not the sampled text", "rejected": "nor this", **refs}
        for refs in (
            {"chosen_tokens_ref": c[0].tokens_ref, "rejected_tokens_ref": c[1].tokens_ref},
            {"chosen_tokens_ref": c[2].tokens_ref, "rejected_tokens_ref": c[3].tokens_ref},
        )
    ]
    hp = {"learning_rate": 1e-3, "beta": 0.1}
    v1 = learner.update_dpo(
        UpdateDpoInput(run_id="dpo-tok", version=1, batch_ref=blobs.put_json({"pairs": pairs}), hyperparameters=hp)
    )
    m1 = _manifest(v1)
    lp = [sum(blobs.get_json(x.tokens_ref)["logprobs"]) for x in c]
    want_c, want_r = (lp[0] + lp[2]) / 2, (lp[1] + lp[3]) / 2
    policy = learner.policy
    prompt = encode_prompt(policy.processor, m, blobs)
    with torch.no_grad(), policy.model.disable_adapter():
        unmasked_c = sum(_seq_logp(policy, prompt, blobs.get_json(c[i].tokens_ref)["token_ids"]) for i in (0, 2)) / 2
    print(
        f"chosen log-prob: update {m1['chosen_logp']:.5f}, sampler {want_c:.5f}, without the grammar {unmasked_c:.5f}"
    )
    assert m1["retokenized"] == 0 and m1["constrained"] == 4
    assert v1.tokens == sum(len(blobs.get_json(x.tokens_ref)["token_ids"]) for x in c)
    assert math.isclose(m1["chosen_logp"], want_c, abs_tol=2e-3)
    assert math.isclose(m1["rejected_logp"], want_r, abs_tol=2e-3)
    assert want_c - unmasked_c > 0.5  # the masks matter: unmasked, the same tokens are much less likely

    # A pair without references is scored on its retokenised text, both sides counted.
    mixed = [pairs[0], {"prompt": m, "chosen": "click_element 3", "rejected": "scroll down 100"}]
    v2 = learner.update_dpo(
        UpdateDpoInput(run_id="dpo-tok", version=2, batch_ref=blobs.put_json({"pairs": mixed}), hyperparameters=hp)
    )
    m2 = _manifest(v2)
    assert m2["retokenized"] == 2 and m2["constrained"] == 2
    sampled = sum(len(blobs.get_json(c[i].tokens_ref)["token_ids"]) for i in (0, 1))
    retok = sum(
        len(completion_ids_from_text(policy.tokenizer, prompt.text, t, True).ids)
        for t in ("click_element 3", "scroll down 100")
    )
    assert v2.tokens == sampled + retok
