"""Per-token log-probs: padded batch, single sequences and the shared-prefix path agree, values and gradients."""

from __future__ import annotations

import random

import torch

from conftest import messages, png_ref
from halo_learner.grpo import GrpoSample, grpo_backward
from halo_learner.logprobs import group_logprobs, packed_group_logprobs, padded_logprobs
from halo_learner.prompts import encode_prompt, prompt_key


def _perturb_lora(policy, seed=0, scale=0.05):
    # A fresh adapter has B = 0; give it weights so the adapter (and the gradient of A) matters.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.trainable_parameters().items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def _two_prompts(policy, blobs):
    m1 = messages(png_ref(blobs, 128, 96, 1), "Goal: click the OK button")
    m2 = messages(png_ref(blobs, 200, 64, 2), "Goal: type hello into the text field, then submit")
    return (m1, encode_prompt(policy.processor, m1, blobs)), (m2, encode_prompt(policy.processor, m2, blobs))


def _random_completions(policy, lengths, seed=0):
    rnd = random.Random(seed)
    V = len(policy.tokenizer)
    return [[rnd.randrange(10, V) for _ in range(n)] for n in lengths]


def test_prompt_has_image_tokens(policy, blobs):
    (_, p1), (_, p2) = _two_prompts(policy, blobs)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for p in (p1, p2):
        n_img = int((p.input_ids == image_id).sum())
        assert n_img == int(p.image_grid_thw.prod(-1).sum()) // 4 > 0
        assert int(p.mm_token_type_ids.sum()) == n_img


def test_padded_single_and_shared_agree(policy, blobs):
    _perturb_lora(policy)
    (_, p1), (_, p2) = _two_prompts(policy, blobs)
    comps = _random_completions(policy, [5, 9, 1, 7])
    prompts = [p1, p1, p2, p2]
    with torch.no_grad():
        batch, mask = padded_logprobs(policy, prompts, comps, 0.7)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            single, _ = padded_logprobs(policy, [p], [c], 0.7)
            assert torch.allclose(batch[i, : len(c)], single[0], atol=1e-5)
        shared, smask = group_logprobs(policy, p2, comps[2:], 0.7)
        assert torch.equal(smask, mask[2:, : smask.shape[1]])
        assert torch.allclose(shared[smask], batch[2:, : smask.shape[1]][smask], atol=1e-5)
        # Packed: prompt once, the completions after it in one sequence with a block mask.
        for rows, p in (([0, 1], p1), ([2, 3], p2), ([1], p1), ([3, 2], p2)):
            packed, pmask = packed_group_logprobs(policy, p, [comps[r] for r in rows], 0.7)
            assert torch.equal(pmask, mask[rows, : pmask.shape[1]])
            assert torch.allclose(packed[pmask], batch[rows, : pmask.shape[1]][pmask], atol=1e-5)
            assert torch.all(packed[~pmask] == 0)


def test_packed_treats_sampled_image_token_as_text(policy, blobs):
    """A sampled completion may contain <|image_pad|>; only the prompt's placeholders take image features."""
    _perturb_lora(policy)
    (_, p1), _ = _two_prompts(policy, blobs)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    comps = _random_completions(policy, [5, 6], seed=7)
    comps[0][2] = image_id
    comps[1][0] = image_id
    with torch.no_grad():
        shared, mask = group_logprobs(policy, p1, comps, 0.7)  # the sampler's cached continuation
        packed, pmask = packed_group_logprobs(policy, p1, comps, 0.7)
    assert torch.equal(mask, pmask)
    assert torch.allclose(packed[pmask], shared[mask], atol=1e-5)


def _grpo_samples(policy, blobs):
    (m1, p1), (m2, p2) = _two_prompts(policy, blobs)
    comps = _random_completions(policy, [6, 3, 8, 1, 5, 7, 4, 2], seed=1)
    rnd = random.Random(2)
    samples = []
    for i, c in enumerate(comps):
        m, p = (m1, p1) if i < 3 else (m2, p2)
        # Sampler log-probs somewhat off the current policy, so ratios move and clipping bites.
        old = [rnd.uniform(-7.0, -4.0) for _ in c] if i % 2 == 0 else None
        samples.append(
            GrpoSample(prompt=p, prompt_key=prompt_key(m), ids=c, advantage=rnd.uniform(-1, 1), old_logprobs=old)
        )
    return samples


def _grads(policy, samples, prefix_sharing: bool, micro_batch: int, kl_coef: float = 0.05):
    params = policy.trainable_parameters()
    policy.model.zero_grad(set_to_none=True)
    loss, _ = grpo_backward(
        policy,
        samples,
        clip_epsilon=0.2,
        kl_coef=kl_coef,
        temperature=0.7,
        max_completion_len=10,
        micro_batch=micro_batch,
        prefix_sharing=prefix_sharing,
    )
    return loss, torch.cat([p.grad.flatten() for p in params.values()])


def test_prefix_sharing_gradients_equal_unshared(policy, blobs):
    """LoRA gradients of the dr_grpo loss: packed groups (whole, and split in chunks) vs. one padded batch."""
    _perturb_lora(policy)
    samples = _grpo_samples(policy, blobs)
    loss_u, g_u = _grads(policy, samples, False, 8)
    assert g_u.norm() > 0
    for micro_batch in (8, 2):  # whole groups of 3 and 5 in one packed sequence; chunks of 2
        loss_s, g_s = _grads(policy, samples, True, micro_batch)
        rel = float((g_s - g_u).norm() / g_u.norm())
        print(
            f"prefix sharing (chunk {micro_batch}): loss {loss_s:.6f} vs {loss_u:.6f}, "
            f"relative grad difference {rel:.2e}"
        )
        assert abs(loss_s - loss_u) < 1e-5
        assert rel < 1e-4
    loss_u0, g_u0 = _grads(policy, samples, False, 8, kl_coef=0.0)  # no reference pass at all
    loss_s0, g_s0 = _grads(policy, samples, True, 8, kl_coef=0.0)
    assert abs(loss_s0 - loss_u0) < 1e-5 and float((g_s0 - g_u0).norm() / g_u0.norm()) < 1e-4


def test_bf16_working_copy_keeps_fp32_master(blobs):
    """In a bf16 model the packed path runs LoRA in bf16 but leaves fp32 weights with fp32 gradients that
    match the fp32-adapter padded baseline up to bf16 rounding."""
    from halo_learner.models import load_policy

    policy = load_policy("tiny-random", device=torch.device("cpu"), dtype=torch.bfloat16)
    _perturb_lora(policy)
    params = policy.trainable_parameters()
    assert all(p.dtype == torch.float32 for p in params.values())  # peft's fp32 adapter
    samples = _grpo_samples(policy, blobs)
    before = {n: p.detach().clone() for n, p in params.items()}
    loss_u, g_u = _grads(policy, samples, False, 8)
    loss_s, g_s = _grads(policy, samples, True, 8)
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in params.values())
    assert all(torch.equal(p, before[n]) for n, p in params.items())  # masters untouched
    rel = float((g_s - g_u).norm() / g_u.norm())
    print(f"bf16: loss {loss_s:.6f} vs {loss_u:.6f}, relative grad difference {rel:.2e}")
    assert rel < 5e-2
