"""dr_grpo policy update, top to bottom (CleanRL style).

For a batch of B completions o_i with advantages A_i (already r_i - mean(r) of their group, no std
division: Dr. GRPO), per completion token t:

    logp_t     = log pi_theta(o_t | prompt, o_<t)          logits / sampling temperature, masked to the
                                                            tokens the sample's grammar allowed at t when it
                                                            was sampled under one (constrained decoding)
    ratio_t    = exp(logp_t - logp_old_t)                   logp_old = sampler's log-prob, or logp.detach()
                                                            (vLLM: --logprobs-mode processed_logprobs, so
                                                            logp_old is after temperature like logp_t)
    pg_t       = -min(ratio_t * A,  clip(ratio_t, 1-eps, 1+eps) * A)
    kl_t       = exp(ref_t - logp_t) - (ref_t - logp_t) - 1    k3 estimator, ref = LoRA disabled, no grad
    loss_t     = pg_t + kl_coef * kl_t                      (kl term skipped when kl_coef == 0)

    loss = sum_{i,t} loss_t * mask_t / (B * L_max)          L_max = the run's policy.maxTokens

The constant denominator is what makes it Dr. GRPO: no per-sequence length normalisation, so short and
long completions are weighted per token alike, and (as in TRL's dr_grpo, B x max_completion_length) the
weight of a token does not change from one batch to the next with the batch's longest completion. A batch
written without max_completion_len falls back to its longest completion (the caller logs it).
One optimiser step per batch.

Stale samples (pipelined iterations, train.maxStaleness 1): the sampler's adapter is one update behind the
one being trained, and the ratio to it may be far outside [1 - eps, 1 + eps] before the step, so the
clipped objective would drop exactly the tokens that matter. With `weight_cap` set, the decoupled objective
of AReaL (arXiv 2505.24298) is used instead: the ratio is taken to the proximal policy (the weights at the
start of this update, logp.detach()) and each token is importance-weighted by the policy's move since
sampling, capped:

    w_t        = min(exp(logp_prox_t - logp_old_t), weight_cap)     no grad; 1 without sampler log-probs
    pg_t       = -w_t * min(ratio_prox_t * A, clip(ratio_prox_t, 1-eps, 1+eps) * A)

Served samples (policy.backend openai) always take the decoupled objective, fresh or not: vLLM's kernels (and its
image preprocessing) give log-probs that differ from the learner's own, and clipping against them would zero the
gradient of whichever tokens the two engines disagree on most, with nothing failing.

A position whose sampler log-prob is unknown (vLLM's -9999 placeholder: a token the server scored as impossible)
in a row that has sampler log-probs is dropped from the loss (batches.py counts it and warns): its importance
weight is unknown, and a ratio of 1 would train it as if it were on-policy. A row without any sampler log-probs
(a server that gave ids only, a retokenised item) is trained as plain policy gradient (ratio 1).

Statistics (before the step, like TRL / CleanRL): kl = mean k3 over completion tokens (when the reference
pass runs); over tokens with sampler log-probs: mean ratio, mean and max |log-ratio| of the learner to the
sampler, and the clip fraction of the ratio the objective clips (to the sampler, or decoupled to the proximal
policy, which is 0 before the step) with the share of importance weights at the cap; entropy = mean -logp_t of the
sampled tokens (a one-sample estimate of the policy's entropy at the sampling temperature).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .logprobs import PackedLayout, pad_completions, packed_group_logprobs, packed_layout, padded_logprobs
from .prompts import EncodedPrompt


def dr_grpo_token_loss(
    logp, old_logp, ref_logp, adv, clip_epsilon: float, kl_coef: float, weight_cap: float | None = None
) -> torch.Tensor:
    """Per-token loss; all tensors broadcast to (rows, tokens), `adv` is (rows, 1).

    `weight_cap` set: the decoupled objective (ratio to the proximal policy, importance weight to the sampler's).
    """
    if weight_cap is None:
        ratio = torch.exp(logp - old_logp)
        weight = None
    else:
        prox = logp.detach()
        ratio = torch.exp(logp - prox)
        weight = torch.clamp(torch.exp(prox - old_logp), max=weight_cap)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_epsilon, 1 + clip_epsilon) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = weight * loss
    if kl_coef != 0:
        log_r = ref_logp - logp
        loss = loss + kl_coef * (torch.exp(log_r) - log_r - 1)
    return loss


@dataclass
class GrpoSample:
    """One completion ready for the loss: prompt encoding, token ids and per-token side data."""

    prompt: EncodedPrompt
    prompt_key: str
    ids: list[int]
    advantage: float
    # The sampler's log-prob of each id; None for all of them (no sampler log-probs: the loss uses the policy's own,
    # ratio 1) or at a position where it is unknown (that position is dropped from the loss).
    old_logprobs: list[float | None] | None
    # Constrained decoding: (len(ids), ceil(V/32)) int32 grammar bitmask of each position (grammar.py).
    bitmask: torch.Tensor | None = None


@dataclass
class RatioStats:
    """How far the policy moved from the sampler on the tokens whose sampler log-probs are known."""

    tokens: int = 0  # completion tokens with a sampler log-prob
    clipped: int = 0  # of those, tokens whose clipped ratio (the objective's) is outside [1 - eps, 1 + eps]
    capped: int = 0  # of those, decoupled: importance weights above the cap
    max_abs_log_ratio: float = 0.0
    abs_log_ratio_sum: float = 0.0
    ratio_sum: float = 0.0

    @property
    def clip_fraction(self) -> float:
        return self.clipped / self.tokens if self.tokens else 0.0

    @property
    def capped_fraction(self) -> float:
        return self.capped / self.tokens if self.tokens else 0.0

    @property
    def mean_ratio(self) -> float | None:
        return self.ratio_sum / self.tokens if self.tokens else None

    @property
    def mean_abs_log_ratio(self) -> float | None:
        return self.abs_log_ratio_sum / self.tokens if self.tokens else None

    def add(
        self,
        log_ratio: torch.Tensor,
        known: torch.Tensor,
        clip_epsilon: float,
        clip_log_ratio: torch.Tensor | None = None,
        weight_cap: float | None = None,
    ) -> None:
        """`log_ratio`: learner to sampler; `clip_log_ratio`: the ratio the objective clips, when it is another."""
        lr = log_ratio.detach()[known]
        if lr.numel() == 0:
            return
        r = torch.exp(lr)
        c = r if clip_log_ratio is None else torch.exp(clip_log_ratio.detach()[known])
        self.tokens += int(lr.numel())
        self.clipped += int(((c < 1 - clip_epsilon) | (c > 1 + clip_epsilon)).sum())
        if weight_cap is not None:
            self.capped += int((r > weight_cap).sum())
        self.ratio_sum += float(r.sum())
        self.abs_log_ratio_sum += float(lr.abs().sum())
        self.max_abs_log_ratio = max(self.max_abs_log_ratio, float(lr.abs().max()))


@dataclass
class TokenStats:
    """Sums over completion tokens: k3 KL to the reference (when computed) and -logp of the sampled token."""

    tokens: int = 0
    nll_sum: float = 0.0
    kl_sum: float | None = None

    def add(self, logp: torch.Tensor, ref: torch.Tensor | None, mask: torch.Tensor) -> None:
        lp = logp.detach()[mask]
        self.tokens += int(lp.numel())
        self.nll_sum -= float(lp.sum())
        if ref is not None:
            log_r = ref[mask] - lp
            self.kl_sum = (self.kl_sum or 0.0) + float((torch.exp(log_r) - log_r - 1).sum())

    @property
    def entropy(self) -> float | None:
        return self.nll_sum / self.tokens if self.tokens else None

    @property
    def kl(self) -> float | None:
        return self.kl_sum / self.tokens if self.tokens and self.kl_sum is not None else None


def dr_grpo_denominator(batch_size: int, max_completion_len: int | None, longest: int) -> float:
    """B x the run's max completion length: a constant of the run, not of the batch (see the docstring)."""
    return float(batch_size * (max_completion_len or longest))


@dataclass
class GrpoStats:
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    ratios: RatioStats | None = None
    token_stats: TokenStats | None = None
    denominator: float = 0.0


def _row_table(samples: list[GrpoSample], L: int, device):
    """Advantages (B,1), old log-probs (B,L) with NaN where the sampler's are unknown (the loss puts the policy's
    own there: ratio 1), and (B,L) True at the unknown positions of rows that have sampler log-probs, which the
    loss drops (the module docstring says why)."""
    adv = torch.tensor([[s.advantage] for s in samples], dtype=torch.float32, device=device)
    old = torch.full((len(samples), L), float("nan"), dtype=torch.float32, device=device)
    dropped = torch.zeros((len(samples), L), dtype=torch.bool, device=device)
    for i, s in enumerate(samples):
        if s.old_logprobs is not None:
            row = [math.nan if lp is None else lp for lp in s.old_logprobs]
            old[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
            dropped[i, : len(row)] = torch.tensor([lp is None for lp in s.old_logprobs], dtype=torch.bool)
    return adv, old, dropped


def _chunks(samples: list[GrpoSample], chunk: int, prefix_sharing: bool) -> list[list[int]]:
    """Row lists processed together: within one prompt group when sharing, else consecutive rows."""
    if prefix_sharing:
        return [idx[s : s + chunk] for idx in _groups(samples).values() for s in range(0, len(idx), chunk)]
    return [list(range(s, min(len(samples), s + chunk))) for s in range(0, len(samples), chunk)]


def reference_logprobs(
    policy,
    samples: list[GrpoSample],
    temperature: float,
    chunk: int,
    prefix_sharing: bool = True,
    on_progress: Callable[[], None] | None = None,
    layouts: dict[int, PackedLayout] | None = None,
    chunks: list[list[int]] | None = None,
) -> torch.Tensor:
    """(B, L) log-probs with the LoRA adapter disabled (the frozen base policy), no gradient.

    With prefix sharing each chunk of a group is one packed sequence (prompt once, completions after it).
    `layouts` (first row of a chunk -> its packed layout) lets the caller reuse the layouts it built; `chunks`
    (default: every chunk of the batch) the rows to compute, the others stay 0.
    """
    L = max(len(s.ids) for s in samples)
    ref = torch.zeros((len(samples), L), dtype=torch.float32, device=policy.device)
    with torch.no_grad(), policy.model.disable_adapter():
        for rows in chunks if chunks is not None else _chunks(samples, chunk, prefix_sharing):
            ids = [samples[r].ids for r in rows]
            masks = [samples[r].bitmask for r in rows]
            if prefix_sharing:
                lay = layouts.get(rows[0]) if layouts is not None else None
                lp, _ = packed_group_logprobs(policy, samples[rows[0]].prompt, ids, temperature, lay, masks)
            else:
                lp, _ = padded_logprobs(policy, [samples[r].prompt for r in rows], ids, temperature, masks)
            ref[rows, : lp.shape[1]] = lp
            if on_progress:
                on_progress()
    return ref


def _groups(samples: list[GrpoSample]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.prompt_key, []).append(i)
    return groups


class LoraWorkingCopy:
    """Run forward/backward with the trainable (LoRA) weights cast to the model's compute dtype.

    peft keeps adapter weights in float32, so in a bf16 model every LoRA call casts its input to float32 and
    back: thousands of extra kernels per pass and a float32 copy of every projection input kept for the
    backward. Inside this context the parameters hold bf16 copies instead; `flush()` adds their gradients,
    in float32, to float32 accumulators, and on exit the float32 master weights come back with the float32
    accumulated gradient in `.grad`, so the optimiser (and its state) still works on float32 weights.
    A no-op when the weights already have the compute dtype (float32 models, the CPU tests).
    """

    def __init__(self, params: list[torch.nn.Parameter], dtype: torch.dtype):
        self.params = [p for p in params if p.dtype != dtype]
        self.dtype = dtype

    def __enter__(self) -> "LoraWorkingCopy":
        self.master = [p.data for p in self.params]
        self.acc = [p.grad for p in self.params]
        for p in self.params:
            p.grad = None
            p.data = p.data.to(self.dtype)
        return self

    def flush(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is not None:
                g = p.grad.float()
                self.acc[i] = g if self.acc[i] is None else self.acc[i].add_(g)
                p.grad = None

    def __exit__(self, *exc) -> None:
        self.flush()
        for p, m, a in zip(self.params, self.master, self.acc):
            p.data = m
            p.grad = a


def grpo_backward(
    policy,
    samples: list[GrpoSample],
    *,
    clip_epsilon: float,
    kl_coef: float,
    temperature: float,
    max_completion_len: int | None,
    micro_batch: int = 8,
    prefix_sharing: bool = True,
    on_progress: Callable[[], None] | None = None,
    ratios: RatioStats | None = None,
    token_stats: TokenStats | None = None,
    weight_cap: float | None = None,
    only: set[int] | None = None,
) -> tuple[float, int]:
    """Accumulate d(loss)/d(LoRA) into .grad; returns (loss, completion tokens); `ratios` collects ratio stats.
    `only`: the indices of the chunks (`_chunks`) to run, a data-parallel rank's shard; the loss is still
    normalised by the whole batch, so the shards' gradients sum to the whole batch's.

    prefix_sharing=True: every chunk of up to `micro_batch` completions of one prompt is one packed sequence
    (prompt once, then the completions, block attention mask), run once without the adapter for the KL
    reference and once with gradient; LoRA weights run in the model dtype (`LoraWorkingCopy`).
    prefix_sharing=False: the textbook padded batch, `micro_batch` full sequences per forward (the baseline).
    """
    dev = policy.device
    B = len(samples)
    L = max(len(s.ids) for s in samples)
    norm = dr_grpo_denominator(B, max_completion_len, L)
    adv, old, dropped = _row_table(samples, L, dev)
    chunks = _chunks(samples, micro_batch, prefix_sharing)
    if only is not None:
        chunks = [c for j, c in enumerate(chunks) if j in only]
    layouts = None
    if prefix_sharing:
        layouts = {}
        for rows in chunks:  # the frozen ViT runs here for every group: a heartbeat after each keeps the attempt alive
            layouts[rows[0]] = packed_layout(policy, samples[rows[0]].prompt, [samples[r].ids for r in rows])
            if on_progress:
                on_progress()
    ref = (
        reference_logprobs(policy, samples, temperature, micro_batch, prefix_sharing, on_progress, layouts, chunks)
        if kl_coef != 0
        else None
    )
    _, mask = pad_completions([s.ids for s in samples], 0, dev)

    def loss_fn(logp: torch.Tensor, rows: torch.Tensor, cols: slice) -> torch.Tensor:
        T = logp.shape[1]
        o = old[rows, cols][:, :T]
        known = ~torch.isnan(o)
        o = torch.where(known, o, logp.detach())  # a row without sampler log-probs: ratio 1, plain PG
        m = mask[rows, cols][:, :T] > 0
        if ratios is not None:
            clip_lr = None if weight_cap is None else logp - logp.detach()
            ratios.add(logp - o, known & m, clip_epsilon, clip_lr, weight_cap)
        r = ref[rows, cols][:, :T] if ref is not None else None
        if token_stats is not None:
            token_stats.add(logp, r, m)
        per_token = dr_grpo_token_loss(logp, o, r, adv[rows], clip_epsilon, kl_coef, weight_cap)
        trained = m & ~dropped[rows, cols][:, :T]
        return (per_token * trained).sum() / norm

    total = 0.0
    params = [p for p in policy.model.parameters() if p.requires_grad]
    with LoraWorkingCopy(params, policy.dtype if prefix_sharing else params[0].dtype) as work:
        for rows_list in chunks:
            rows = torch.tensor(rows_list, device=dev)
            masks = [samples[i].bitmask for i in rows_list]
            if prefix_sharing:
                logp, _ = packed_group_logprobs(
                    policy,
                    samples[rows_list[0]].prompt,
                    [samples[i].ids for i in rows_list],
                    temperature,
                    layouts[rows_list[0]],
                    masks,
                )
            else:
                logp, _ = padded_logprobs(
                    policy,
                    [samples[i].prompt for i in rows_list],
                    [samples[i].ids for i in rows_list],
                    temperature,
                    masks,
                )
            loss = loss_fn(logp, rows, slice(0, logp.shape[1]))
            loss.backward()
            total += float(loss.detach())
            del logp, loss
            work.flush()
            if on_progress:
                on_progress()
    return total, int(mask.sum())


def apply_gradients(policy, optimizer, max_grad_norm: float) -> float:
    """Clip to max_grad_norm, one AdamW step; returns the pre-clip gradient norm."""
    params = [p for p in policy.model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"non-finite gradient norm {grad_norm}; update skipped")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def shard_chunks(samples: list[GrpoSample], micro_batch: int, prefix_sharing: bool, ranks) -> set[int]:
    """This rank's chunks: whole prompt groups (packed; padded: single chunks), spread by their tokens."""
    from .distributed import owners

    chunks = _chunks(samples, micro_batch, prefix_sharing)
    unit = [samples[c[0]].prompt_key if prefix_sharing else str(j) for j, c in enumerate(chunks)]
    cost: dict[str, float] = {}
    for u, c in zip(unit, chunks):
        cost[u] = cost.get(u, 0.0) + len(samples[c[0]].prompt) + sum(len(samples[i].ids) for i in c)
    owner = dict(zip(cost, owners(list(cost.values()), ranks.world)))
    return {j for j, u in enumerate(unit) if owner[u] == ranks.rank}


def _reduce_stats(ranks, loss: float, ratios: RatioStats, ts: TokenStats) -> float:
    """Every rank's sums of the statistics (and the max |log-ratio|), into its own; returns the batch's loss."""
    sums = ranks.sum(
        [
            loss,
            ratios.tokens,
            ratios.clipped,
            ratios.capped,
            ratios.abs_log_ratio_sum,
            ratios.ratio_sum,
            ts.tokens,
            ts.nll_sum,
            ts.kl_sum or 0.0,
            float(ts.kl_sum is not None),
        ]
    )
    (ratios.max_abs_log_ratio,) = ranks.max([ratios.max_abs_log_ratio])
    loss, tok, clipped, capped, ratios.abs_log_ratio_sum, ratios.ratio_sum, ttok, ts.nll_sum, kl, has_kl = sums
    ratios.tokens, ratios.clipped, ratios.capped, ts.tokens = int(tok), int(clipped), int(capped), int(ttok)
    ts.kl_sum = kl if has_kl else None
    return loss


def grpo_step(
    policy,
    optimizer,
    samples: list[GrpoSample],
    *,
    clip_epsilon: float,
    kl_coef: float,
    temperature: float,
    max_grad_norm: float,
    max_completion_len: int | None,
    micro_batch: int = 8,
    prefix_sharing: bool = True,
    on_progress: Callable[[], None] | None = None,
    weight_cap: float | None = None,
    ranks=None,
) -> GrpoStats:
    """One optimiser step on the batch; with `ranks` (distributed.Ranks) this rank's shard of it, the gradients and
    statistics summed over the ranks before the step (the same step on every rank)."""
    t0 = time.monotonic()
    optimizer.zero_grad(set_to_none=True)
    ratios, token_stats = RatioStats(), TokenStats()
    backward = dict(
        clip_epsilon=clip_epsilon,
        kl_coef=kl_coef,
        temperature=temperature,
        max_completion_len=max_completion_len,
        micro_batch=micro_batch,
        prefix_sharing=prefix_sharing,
        on_progress=on_progress,
        ratios=ratios,
        token_stats=token_stats,
        weight_cap=weight_cap,
    )
    if ranks is None:
        loss, tokens = grpo_backward(policy, samples, **backward)
    else:
        from .distributed import digest

        error, loss, tokens = None, 0.0, 0
        try:
            mine = shard_chunks(samples, micro_batch, prefix_sharing, ranks)
            loss, tokens = grpo_backward(policy, samples, only=mine, **backward)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it before the collectives
            error = e
        ranks.settle(error, digest([[s.prompt_key, len(s.prompt), len(s.ids), s.advantage] for s in samples]))
        ranks.reduce_gradients([p for p in policy.model.parameters() if p.requires_grad])
        loss = _reduce_stats(ranks, loss, ratios, token_stats)
    grad_norm = apply_gradients(policy, optimizer, max_grad_norm)
    denominator = dr_grpo_denominator(len(samples), max_completion_len, max(len(s.ids) for s in samples))
    return GrpoStats(
        loss=loss,
        grad_norm=grad_norm,
        tokens=tokens,
        seconds=time.monotonic() - t0,
        ratios=ratios,
        token_stats=token_stats,
        denominator=denominator,
    )
