"""dr_grpo: the loss matches the formula computed by hand, and an update moves log-probs the right way."""

from __future__ import annotations

import dataclasses
import math
import random

import torch

from conftest import messages, png_ref, tokens_ref
from halo_learner.grpo import GrpoSample, grpo_step
from halo_learner.logprobs import padded_logprobs
from halo_learner.payloads import SampleActionsInput, UpdatePolicyInput
from halo_learner.prompts import encode_prompt, prompt_key


def _perturb(policy, seed=3, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.trainable_parameters().items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def test_loss_matches_hand_computation(learner, blobs):
    policy = learner.policy
    _perturb(policy)
    m = messages(png_ref(blobs, 96, 96, 5), "Goal: press OK")
    prompt = encode_prompt(policy.processor, m, blobs)
    rnd = random.Random(0)
    V = len(policy.tokenizer)
    comps = [[rnd.randrange(10, V) for _ in range(n)] for n in (4, 2, 6)]
    advs = [0.8, -0.5, -0.3]
    T, eps, beta, Lmax = 0.7, 0.2, 0.1, 8

    # Per-token log-probs, one sequence at a time: current policy and reference (adapter off).
    with torch.no_grad():
        cur = [padded_logprobs(policy, [prompt], [c], T)[0][0].tolist() for c in comps]
        with policy.model.disable_adapter():
            ref = [padded_logprobs(policy, [prompt], [c], T)[0][0].tolist() for c in comps]
    # Sampler log-probs: shifted so some ratios leave [1-eps, 1+eps] and clipping is exercised.
    shifts = [0.5, -0.4, 0.05]
    olds = [[lp + shifts[i] * (1 if t % 2 else -1) for t, lp in enumerate(cur[i])] for i in range(3)]
    olds[2] = None  # no sampler log-probs: old = current, ratio 1

    expected = 0.0
    for i, c in enumerate(comps):
        for t in range(len(c)):
            logp = cur[i][t]
            old = olds[i][t] if olds[i] is not None else logp
            ratio = math.exp(logp - old)
            pg = -min(ratio * advs[i], min(max(ratio, 1 - eps), 1 + eps) * advs[i])
            kl = math.exp(ref[i][t] - logp) - (ref[i][t] - logp) - 1
            expected += pg + beta * kl
    expected /= len(comps) * Lmax

    samples = [
        GrpoSample(prompt=prompt, prompt_key=prompt_key(m), ids=c, advantage=a, old_logprobs=o)
        for c, a, o in zip(comps, advs, olds)
    ]
    stats = grpo_step(
        policy,
        learner.optimizer,
        samples,
        clip_epsilon=eps,
        kl_coef=beta,
        temperature=T,
        max_grad_norm=1.0,
        max_completion_len=Lmax,
        micro_batch=2,
    )
    print(f"dr_grpo loss {stats.loss:.8f}, by hand {expected:.8f}")
    assert abs(stats.loss - expected) < 1e-6 * max(1.0, abs(expected))
    assert stats.tokens == sum(len(c) for c in comps)


def _logp_sum(policy, prompt, ids, T=1.0):
    with torch.no_grad():
        return float(padded_logprobs(policy, [prompt], [ids], T)[0].sum())


def test_advantage_sign_moves_logprob(learner, blobs):
    policy = learner.policy
    m = messages(png_ref(blobs, 64, 64, 9), "Goal: click submit")
    prompt = encode_prompt(policy.processor, m, blobs)
    rnd = random.Random(4)
    V = len(policy.tokenizer)
    good = [rnd.randrange(10, V) for _ in range(6)]
    bad = [rnd.randrange(10, V) for _ in range(6)]
    before = (_logp_sum(policy, prompt, good), _logp_sum(policy, prompt, bad))
    batch = blobs.put_json(
        {
            "items": [
                {"prompt": m, "completion": "", "tokens_ref": tokens_ref(blobs, good), "advantage": 1.0},
                {"prompt": m, "completion": "", "tokens_ref": tokens_ref(blobs, bad), "advantage": -1.0},
            ],
            "max_completion_len": None,
        }
    )
    out = learner.update_policy(
        UpdatePolicyInput(
            run_id="sign",
            version=1,
            batch_ref=batch,
            hyperparameters={"learning_rate": 5e-3, "kl_coef": 0.0, "temperature": 1.0},
        )
    )
    after = (_logp_sum(policy, prompt, good), _logp_sum(policy, prompt, bad))
    print(f"positive advantage: {before[0]:.3f} -> {after[0]:.3f}; negative: {before[1]:.3f} -> {after[1]:.3f}")
    assert not out.reused and out.tokens == 12
    assert after[0] > before[0] + 0.05
    assert after[1] < before[1] - 0.05


def _manifest_metrics(out):
    from halo_learner import adapters
    from pathlib import Path

    return adapters.read_manifest(Path(out.adapter_path))["metrics"]


def test_sampler_ids_and_logprobs_make_the_ratio_real(learner, blobs):
    """The sampler's own ids and log-probs, read from its token blobs, reach the loss: ratio 1 on-policy, != 1 once
    the policy moved."""
    m = messages(png_ref(blobs, 64, 64, 21), "Goal: press the blue button")
    out = learner.sample_actions(
        SampleActionsInput(
            run_id="ratio",
            version=0,
            prompt_ref=blobs.put_json(m),
            n=4,
            temperature=1.0,
            max_tokens=6,
            seed=5,
            store_tokens=True,
        )
    )
    items = [
        {
            "prompt": m,
            "completion": c.text,
            "tokens_ref": c.tokens_ref,
            "advantage": a,
            "finish_reason": c.finish_reason,
        }
        for c, a in zip(out.completions, (1.0, -1.0, 0.5, -0.5))
    ]
    tokens = sum(len(blobs.get_json(c.tokens_ref)["token_ids"]) for c in out.completions)
    hp = {"learning_rate": 2e-2, "kl_coef": 0.0, "temperature": 1.0, "clip_epsilon": 0.2}

    # v1 trains on the tokens v0 sampled, with v0's log-probs: on-policy, every ratio is 1.
    v1 = learner.update_policy(
        UpdatePolicyInput(run_id="ratio", version=1, batch_ref=blobs.put_json({"items": items}), hyperparameters=hp)
    )
    m1 = _manifest_metrics(v1)
    assert v1.retokenized == 0 and v1.tokens == tokens
    assert m1["ratio_tokens"] == tokens
    assert m1["max_abs_log_ratio"] < 1e-3 and m1["clip_fraction"] == 0.0

    # v2 trains on the same samples with the same (now stale) v0 log-probs: the policy moved, the ratio is not 1.
    v2 = learner.update_policy(
        UpdatePolicyInput(run_id="ratio", version=2, batch_ref=blobs.put_json({"items": items}), hyperparameters=hp)
    )
    m2 = _manifest_metrics(v2)
    print(
        f"max |log ratio|: on-policy {m1['max_abs_log_ratio']:.2e}, after one update {m2['max_abs_log_ratio']:.3f}, "
        f"clipped {m2['clip_fraction']:.3f}"
    )
    assert m2["ratio_tokens"] == tokens
    assert m2["max_abs_log_ratio"] > 0.05
    assert m2["clip_fraction"] > 0.0

    # Without sampler log-probs (a server that gave ids only) there is no ratio to speak of (plain policy gradient).
    plain = [{**it, "tokens_ref": tokens_ref(blobs, blobs.get_json(it["tokens_ref"])["token_ids"])} for it in items]
    v3 = learner.update_policy(
        UpdatePolicyInput(run_id="ratio", version=3, batch_ref=blobs.put_json({"items": plain}), hyperparameters=hp)
    )
    assert _manifest_metrics(v3)["ratio_tokens"] == 0


def test_retokenised_fallback_is_counted_and_ids_are_used_as_given(learner, blobs, monkeypatch):
    """Items with the sampler's tokens are not retokenised; text-only items are, and unfaithful ones are counted."""
    import halo_learner.steps as steps_mod

    retokenise = steps_mod.completion_ids_from_text

    def unfaithful_world(tok, prompt_text, completion, end_of_turn):
        r = retokenise(tok, prompt_text, completion, end_of_turn)
        return dataclasses.replace(r, mismatch=r.mismatch or completion == "world")

    monkeypatch.setattr(steps_mod, "completion_ids_from_text", unfaithful_world)
    m = messages(None, "Goal: type hello")
    tok = learner.policy.tokenizer
    given = tok("hello world", add_special_tokens=False)["input_ids"][::-1] + [tok.convert_tokens_to_ids("<|im_end|>")]
    items = [
        # The sampler's tokens, deliberately not what tokenising the text gives: used as they are.
        {
            "prompt": m,
            "completion": "hello world",
            "tokens_ref": tokens_ref(blobs, given, [-1.0] * len(given)),
            "advantage": 1.0,
        },
        # Text only, faithful retokenisation.
        {"prompt": m, "completion": "hello", "tokens_ref": None, "advantage": -1.0},
        # Text only, a retokenisation that may differ from what was sampled: counted as a mismatch.
        {"prompt": m, "completion": "world", "advantage": 0.5},
    ]
    retok = [len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in ("hello", "world")]
    out = learner.update_policy(
        UpdatePolicyInput(
            run_id="retok", version=1, batch_ref=blobs.put_json({"items": items}), hyperparameters={"kl_coef": 0.0}
        )
    )
    assert out.retokenized == 2
    assert out.token_mismatch_rate == 0.5
    assert out.tokens == len(given) + sum(retok)
    assert _manifest_metrics(out)["ratio_tokens"] == len(given)  # only the item with the sampler's log-probs


def test_dr_grpo_denominator_is_constant_across_batches(learner, blobs, caplog):
    """B x max_completion_len (the run's policy.maxTokens), whatever the batch's longest completion."""
    m = messages(png_ref(blobs, 64, 64, 31), "Goal: submit the form")
    rnd = random.Random(7)

    def batch(lengths, max_len):
        return blobs.put_json(
            {
                "items": [
                    {
                        "prompt": m,
                        "completion": "",
                        "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(n)]),
                        "advantage": a,
                    }
                    for n, a in zip(lengths, (0.5, -0.5, 0.25, -0.25))
                ],
                "max_completion_len": max_len,
            }
        )

    hp = {"learning_rate": 1e-3, "kl_coef": 0.01, "temperature": 1.0}
    short = learner.update_policy(
        UpdatePolicyInput(run_id="denom", version=1, batch_ref=batch([2, 3, 2, 1], 16), hyperparameters=hp)
    )
    long = learner.update_policy(
        UpdatePolicyInput(run_id="denom", version=2, batch_ref=batch([12, 9, 16, 5], 16), hyperparameters=hp)
    )
    print(f"tokens {short.tokens} vs {long.tokens}; denominators {short.denominator} and {long.denominator}")
    assert short.tokens != long.tokens
    assert short.denominator == long.denominator == 4 * 16
    with caplog.at_level("WARNING", logger="halo_learner"):
        legacy = learner.update_policy(
            UpdatePolicyInput(run_id="denom", version=3, batch_ref=batch([2, 7, 3, 1], None), hyperparameters=hp)
        )
    assert legacy.denominator == 4 * 7
    assert "has no max_completion_len" in caplog.text


def test_update_statistics_match_their_definitions(learner, blobs):
    """kl (k3 to the base model), mean ratio, clip fraction and entropy proxy, computed by hand."""
    policy = learner.policy
    _perturb(policy, seed=5)
    m = messages(png_ref(blobs, 64, 64, 33), "Goal: open settings")
    prompt = encode_prompt(policy.processor, m, blobs)
    rnd = random.Random(9)
    comps = [[rnd.randrange(10, 390) for _ in range(n)] for n in (5, 3)]
    with torch.no_grad():
        cur = [padded_logprobs(policy, [prompt], [c], 1.0)[0][0] for c in comps]
        with policy.model.disable_adapter():
            ref = [padded_logprobs(policy, [prompt], [c], 1.0)[0][0] for c in comps]
    old = [(cur[0] + torch.tensor([0.5, -0.5, 0.01, 0.3, -0.02])).tolist(), None]
    samples = [
        GrpoSample(prompt=prompt, prompt_key=prompt_key(m), ids=c, advantage=a, old_logprobs=o)
        for c, a, o in zip(comps, (1.0, -1.0), old)
    ]
    stats = grpo_step(
        policy,
        learner.optimizer,
        samples,
        clip_epsilon=0.2,
        kl_coef=0.1,
        temperature=1.0,
        max_grad_norm=1.0,
        max_completion_len=8,
        micro_batch=2,
    )
    lp, rf = torch.cat(cur), torch.cat(ref)
    kl = float((torch.exp(rf - lp) - (rf - lp) - 1).mean())
    ratio = torch.exp(cur[0] - torch.tensor(old[0]))
    ts, rs = stats.token_stats, stats.ratios
    assert math.isclose(ts.kl, kl, rel_tol=1e-4, abs_tol=1e-7)
    assert math.isclose(ts.entropy, float(-lp.mean()), rel_tol=1e-5)
    assert rs.tokens == 5 and math.isclose(rs.mean_ratio, float(ratio.mean()), rel_tol=1e-5)
    assert rs.clip_fraction == int(((ratio < 0.8) | (ratio > 1.2)).sum()) / 5


def test_packed_pass_refuses_eager_attention(policy, blobs):
    """eager adds the boolean block mask to the scores instead of masking: refused at load and per pass."""
    import pytest

    from halo_learner.learner import Learner, Settings
    from halo_learner.logprobs import UnsupportedAttention, packed_group_logprobs

    m = messages(png_ref(blobs, 64, 64, 35), "Goal: x")
    prompt = encode_prompt(policy.processor, m, blobs)
    packed_group_logprobs(policy, prompt, [[11, 12, 13], [14, 15]], 1.0)  # sdpa: fine
    policy.model.base_model.model.set_attn_implementation("eager")
    with pytest.raises(UnsupportedAttention, match="'eager'.*sdpa.*HALO_PREFIX_SHARING=0"):
        packed_group_logprobs(policy, prompt, [[11, 12, 13], [14, 15]], 1.0)
    with pytest.raises(UnsupportedAttention):
        Learner(policy, blobs=blobs, settings=Settings(prefix_sharing=True))
    Learner(policy, blobs=blobs, settings=Settings(prefix_sharing=False))  # the padded path is mask-agnostic


def test_stale_samples_keep_their_gradient_under_the_decoupled_objective():
    from halo_learner.grpo import dr_grpo_token_loss

    # The policy moved since sampling: token 0 from 0.2 to 0.5 (ratio 2.5), token 1 from 0.45 to 0.5 (1.11).
    old = torch.log(torch.tensor([[0.2, 0.45]]))
    adv = torch.tensor([[1.0]])

    def grads(**kw):
        logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
        dr_grpo_token_loss(logp, old, None, adv, 0.2, 0.0, **kw).sum().backward()
        return logp.grad[0].tolist()

    # Clipped to the sampler: the token that moved most gets no gradient at all.
    plain = grads()
    assert plain[0] == 0.0 and math.isclose(plain[1], -0.5 / 0.45, rel_tol=1e-5)
    # Decoupled: ratio 1 to the weights at the update's start, weighted by how far the policy moved (capped).
    assert all(math.isclose(g, e, rel_tol=1e-5) for g, e in zip(grads(weight_cap=5.0), [-2.5, -0.5 / 0.45]))
    assert all(math.isclose(g, e, rel_tol=1e-5) for g, e in zip(grads(weight_cap=2.0), [-2.0, -0.5 / 0.45]))
    # On-policy (sampler = current weights) the two objectives agree.
    on = torch.log(torch.tensor([[0.5, 0.5]]))
    for kw in ({}, {"weight_cap": 5.0}):
        logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
        dr_grpo_token_loss(logp, on, None, adv, 0.2, 0.0, **kw).sum().backward()
        assert logp.grad[0].tolist() == [-1.0, -1.0]
