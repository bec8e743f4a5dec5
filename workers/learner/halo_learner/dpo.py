"""Sigmoid DPO update for step-level preference pairs (Agent-Q style), top to bottom.

For a pair (prompt x, chosen y_c, rejected y_r), with sequence log-probs summed over completion tokens:

    pi_c  = log pi_theta(y_c | x)        ref_c = log pi_ref(y_c | x)
    pi_r  = log pi_theta(y_r | x)        ref_r = log pi_ref(y_r | x)
    z     = beta * ((pi_c - ref_c) - (pi_r - ref_r))      the implicit reward margin
    loss  = mean over pairs of  -log sigmoid(z)

One reference for every pair of every batch: pi_ref is the base model, i.e. the resident model with the
LoRA adapter disabled (as TRL's DPOTrainer does with a peft model). Logged reference log-probs that a pair
may carry (the sampler's, at its sampling temperature and from whichever adapter sampled it) are ignored:
mixing them with recomputed ones would optimise two objectives in one batch.
Metrics: reward_margin = mean z, accuracy = fraction of pairs with z > 0 (both before the step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .grpo import apply_gradients
from .logprobs import group_logprobs
from .prompts import EncodedPrompt


@dataclass
class DpoSample:
    prompt: EncodedPrompt
    prompt_key: str
    chosen: list[int]
    rejected: list[int]
    ref_chosen: float | None
    ref_rejected: float | None


@dataclass
class DpoStats:
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    reward_margin: float
    accuracy: float
    logged_refs_ignored: int = 0


def dpo_loss(pi_c, pi_r, ref_c, ref_r, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair losses and margins z."""
    z = beta * ((pi_c - ref_c) - (pi_r - ref_r))
    return -F.logsigmoid(z), z


def _sequence_logprobs(policy, prompt: EncodedPrompt, seqs: list[list[int]]) -> torch.Tensor:
    # DPO scores sequences under the raw policy distribution (temperature 1).
    lp, mask = group_logprobs(policy, prompt, seqs, 1.0)
    return (lp * mask).sum(dim=1)


def dpo_step(
    policy,
    optimizer,
    samples: list[DpoSample],
    *,
    beta: float,
    max_grad_norm: float,
    pairs_per_chunk: int = 4,
    on_progress: Callable[[], None] | None = None,
) -> DpoStats:
    t0 = time.monotonic()
    n = len(samples)
    chunks: list[list[int]] = []
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.prompt_key, []).append(i)
    for idx in groups.values():
        chunks += [idx[k : k + pairs_per_chunk] for k in range(0, len(idx), pairs_per_chunk)]

    optimizer.zero_grad(set_to_none=True)
    total, margins = 0.0, []
    for rows in chunks:
        prompt = samples[rows[0]].prompt
        seqs = [t for r in rows for t in (samples[r].chosen, samples[r].rejected)]  # c0, r0, c1, r1, ...
        with torch.no_grad(), policy.model.disable_adapter():
            ref = _sequence_logprobs(policy, prompt, seqs)
        pi = _sequence_logprobs(policy, prompt, seqs)
        losses, z = dpo_loss(pi[0::2], pi[1::2], ref[0::2], ref[1::2], beta)
        loss = losses.sum() / n  # mean over all pairs of the batch, accumulated chunk by chunk
        loss.backward()
        total += float(loss.detach())
        margins += z.detach().tolist()
        if on_progress:
            on_progress()
    grad_norm = apply_gradients(policy, optimizer, max_grad_norm)
    tokens = sum(len(s.chosen) + len(s.rejected) for s in samples)
    return DpoStats(
        loss=total,
        grad_norm=grad_norm,
        tokens=tokens,
        seconds=time.monotonic() - t0,
        reward_margin=sum(margins) / n,
        accuracy=sum(z > 0 for z in margins) / n,
        logged_refs_ignored=sum(s.ref_chosen is not None for s in samples),
    )
