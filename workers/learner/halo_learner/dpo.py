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
Log-probs are the raw policy's (temperature 1); a completion sampled under the action grammar (constrained
decoding) is scored under the same per-position masks (grammar.py), for the policy and the reference alike,
so both are distributions over the tokens the sampler could have picked.

Packed (the default): the pairs of one prompt (the siblings of one search node) share it, and its pairs are
chunked as the memory plan fits them (memory.plan_dpo; at mcts-real's shape one chunk per prompt, with as many
decoder layers checkpointed as the budget needs where the prompt's pairs would otherwise need several chunks). Per prompt the frozen ViT runs once; per
chunk one packed sequence (logprobs.packed_layout: the prompt once, the chosen and rejected completions of its
pairs after it) runs twice: no grad with the adapter disabled (the reference), then forward+backward with the
LoRA weights as bf16 working copies (grpo.LoraWorkingCopy). Policy and reference see the same layout, so with
the adapter at zero they agree to the bit (eager) and z = 0, and bf16 rounding of one layout never reads as a
preference. Unpacked (HALO_PREFIX_SHARING=0, the baseline): each chunk of pairs runs its prompt once per pass
and the completions right-padded on its expanded KV cache (group_logprobs), float32 LoRA. Both give the same
gradient (tests/test_dpo.py).
Metrics: reward_margin = mean z, accuracy = fraction of pairs with z > 0, chosen_logp / rejected_logp = mean
pi_c / pi_r (all before the step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from .grpo import LoraWorkingCopy, apply_gradients
from .logprobs import (
    PackedLayout,
    checkpointed_layers,
    compiled_stance,
    group_logprobs,
    image_features,
    packed_group_logprobs,
    packed_layout,
)
from .memory import DpoPlan, MemoryModel, PairShape, forward_units, plan_dpo
from .prompts import EncodedPrompt


@dataclass
class DpoSample:
    prompt: EncodedPrompt
    prompt_key: str
    chosen: list[int]
    rejected: list[int]
    ref_chosen: float | None = None
    ref_rejected: float | None = None
    # Constrained decoding: (len(ids), ceil(V/32)) int32 grammar bitmask of each completion (grammar.py).
    chosen_bitmask: torch.Tensor | None = None
    rejected_bitmask: torch.Tensor | None = None

    @property
    def constrained(self) -> bool:
        return self.chosen_bitmask is not None or self.rejected_bitmask is not None


@dataclass
class DpoStats:
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    reward_margin: float
    accuracy: float
    logged_refs_ignored: int = 0
    chosen_logp: float = 0.0
    rejected_logp: float = 0.0
    chunks: int = 0
    checkpointed_chunks: int = 0


@dataclass
class DpoPass:
    """What a backward over the batch measured, per pair, before the step."""

    loss: float = 0.0
    z: list[float] = field(default_factory=list)
    pi: list[tuple[float, float]] = field(default_factory=list)


def dpo_loss(pi_c, pi_r, ref_c, ref_r, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair losses and margins z."""
    z = beta * ((pi_c - ref_c) - (pi_r - ref_r))
    return -F.logsigmoid(z), z


def plan_chunks(policy, samples: list[DpoSample], cap: int, packed: bool = True, budget: int | None = None) -> DpoPlan:
    """The batch's chunks under `budget` (memory.plan_dpo); no budget: at most `cap` pairs per chunk."""
    shapes = [PairShape(s.prompt_key, len(s.prompt), len(s.chosen), len(s.rejected), s.constrained) for s in samples]
    return plan_dpo(shapes, cap, budget, MemoryModel.from_policy(policy, packed), packed)


def _completions(samples: list[DpoSample], rows: list[int]) -> tuple[list[list[int]], list]:
    """Ids and grammar masks of the rows' completions: chosen_0, rejected_0, chosen_1, ..."""
    ids, masks = [], []
    for r in rows:
        s = samples[r]
        ids += [s.chosen, s.rejected]
        masks += [s.chosen_bitmask, s.rejected_bitmask]
    return ids, masks


def _pair_logprobs(
    policy, samples: list[DpoSample], rows: list[int], layout: PackedLayout | None = None
) -> torch.Tensor:
    """(len(rows), 2) sequence log-probs of (chosen, rejected) of each pair; all rows share one prompt.

    With `layout`: its one packed sequence; else the prompt's KV under right-padded completion rows."""
    ids, masks = _completions(samples, rows)
    prompt = samples[rows[0]].prompt
    if layout is not None:
        lp, mask = packed_group_logprobs(policy, prompt, ids, 1.0, layout, masks)
    else:
        lp, mask = group_logprobs(policy, prompt, ids, 1.0, masks)
    return (lp * mask).sum(dim=1).view(-1, 2)


def dpo_backward(
    policy,
    samples: list[DpoSample],
    *,
    beta: float,
    plan: DpoPlan,
    packed: bool = True,
    on_progress: Callable[[], None] | None = None,
    only: set[int] | None = None,
) -> DpoPass:
    """Accumulate d(loss)/d(LoRA) into .grad over the plan's chunks (see the module's docstring); `only`: the
    indices of the plan's groups to run (a data-parallel rank's shard), the other pairs' z and pi stay 0."""
    n = len(samples)
    out = DpoPass(z=[0.0] * n, pi=[(0.0, 0.0)] * n)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    with LoraWorkingCopy(params, policy.dtype if packed else params[0].dtype) as work:
        for gi, group in enumerate(plan.groups):
            if only is not None and gi not in only:
                continue
            prompt = samples[group.chunks[0][0]].prompt
            feats = image_features(policy, prompt) if packed else None
            for ci, rows in enumerate(group.chunks):
                lay = packed_layout(policy, prompt, _completions(samples, rows)[0], feats) if packed else None
                with torch.no_grad(), policy.model.disable_adapter():
                    ref = _pair_logprobs(policy, samples, rows, lay).float()
                with checkpointed_layers(policy, group.checkpointed_layers(ci)), compiled_stance(policy):
                    pi = _pair_logprobs(policy, samples, rows, lay)
                    losses, z = dpo_loss(pi[:, 0], pi[:, 1], ref[:, 0], ref[:, 1], beta)
                    loss = losses.sum() / n  # mean over all pairs of the batch, accumulated chunk by chunk
                    loss.backward()
                work.flush()
                out.loss += float(loss.detach())
                for r, zr, (pc, pr) in zip(rows, z.detach().tolist(), pi.detach().tolist()):
                    out.z[r], out.pi[r] = zr, (pc, pr)
                del lay, ref, pi, losses, z, loss
                if on_progress:
                    on_progress()
            del feats
    return out


def shard_groups(samples: list[DpoSample], plan: DpoPlan, ranks) -> set[int]:
    """This rank's prompt groups of the plan, spread over the ranks by their compute (memory.forward_units)."""
    from .distributed import owners

    cost = [
        sum(
            forward_units(
                len(samples[c[0]].prompt) + sum(len(samples[r].chosen) + len(samples[r].rejected) for r in c),
                g.checkpointed_layers(i),
                plan.decoder_layers,
            )
            for i, c in enumerate(g.chunks)
        )
        for g in plan.groups
    ]
    return {gi for gi, r in enumerate(owners(cost, ranks.world)) if r == ranks.rank}


def _sharded_backward(policy, samples, beta, plan, packed, on_progress, ranks) -> DpoPass:
    from .distributed import digest

    n = len(samples)
    error, res = None, DpoPass(z=[0.0] * n, pi=[(0.0, 0.0)] * n)
    try:
        mine = shard_groups(samples, plan, ranks)
        res = dpo_backward(policy, samples, beta=beta, plan=plan, packed=packed, on_progress=on_progress, only=mine)
    except Exception as e:  # noqa: BLE001 - every rank must hear of it before the collectives
        error = e
    shapes = [[s.prompt_key, len(s.prompt), len(s.chosen), len(s.rejected)] for s in samples]
    ranks.settle(error, digest([shapes, [g.chunks for g in plan.groups]]))
    ranks.reduce_gradients([p for p in policy.model.parameters() if p.requires_grad])
    # Each pair ran on one rank and is 0 on the others: the sums are the pairs' values.
    flat = ranks.sum([res.loss, *res.z, *(v for pair in res.pi for v in pair)])
    return DpoPass(loss=flat[0], z=flat[1 : n + 1], pi=[(flat[n + 1 + 2 * i], flat[n + 2 + 2 * i]) for i in range(n)])


def dpo_step(
    policy,
    optimizer,
    samples: list[DpoSample],
    *,
    beta: float,
    max_grad_norm: float,
    pairs_per_chunk: int = 4,
    packed: bool = True,
    plan: DpoPlan | None = None,
    on_progress: Callable[[], None] | None = None,
    ranks=None,
) -> DpoStats:
    """One optimiser step on the batch; `plan` (plan_chunks) sets the chunks, else `pairs_per_chunk` without a
    memory budget. With `ranks` (distributed.Ranks) this rank runs its shard of the plan's prompt groups, and the
    gradients and per-pair results are summed over the ranks before the step (the same step on every rank)."""
    t0 = time.monotonic()
    n = len(samples)
    plan = plan or plan_chunks(policy, samples, pairs_per_chunk, packed)
    optimizer.zero_grad(set_to_none=True)
    if ranks is None:
        res = dpo_backward(policy, samples, beta=beta, plan=plan, packed=packed, on_progress=on_progress)
    else:
        res = _sharded_backward(policy, samples, beta, plan, packed, on_progress, ranks)
    grad_norm = apply_gradients(policy, optimizer, max_grad_norm)
    return DpoStats(
        loss=res.loss,
        grad_norm=grad_norm,
        tokens=sum(len(s.chosen) + len(s.rejected) for s in samples),
        seconds=time.monotonic() - t0,
        reward_margin=sum(res.z) / n,
        accuracy=sum(z > 0 for z in res.z) / n,
        logged_refs_ignored=sum(s.ref_chosen is not None for s in samples),
        chosen_logp=sum(c for c, _ in res.pi) / n,
        rejected_logp=sum(r for _, r in res.pi) / n,
        chunks=plan.chunks,
        checkpointed_chunks=plan.checkpointed,
    )
