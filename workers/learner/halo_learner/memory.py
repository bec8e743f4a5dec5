"""How many completions go into one forward+backward, chosen from the batch's shape under a memory budget.

The learner shares its GPU with vLLM (docker-compose gives vLLM `--gpu-memory-utilization 0.5`), so an update
must stay under what is left, whatever the batch's completion lengths. The peak of a GRPO update is the
gradient pass of its largest chunk:

    peak ~ resident                         weights, LoRA masters, AdamW moments (allocated before the step)
         + act_bytes_per_token * S          activations kept for backward over the chunk's S tokens
         + logit_bytes * keep * V           bf16 logits, float32 log-softmax and its gradient (kept rows only)

with S the packed length (prompt once + the completions; padded path: k full rows). `act_bytes_per_token`
is measured on the 8B without gradient checkpointing (H100, bench/RESULTS.md, 2026-11-23): 8.06 MB per token
on the packed path (bf16 LoRA working copies), 10.9 MB on the padded path (peft's float32 LoRA), i.e. ~55 and
~74 bytes per hidden unit per decoder layer; the defaults below keep a few percent above those.
`HALO_ACT_BYTES_PER_TOKEN` overrides both.

A DPO update (`plan_dpo`) chunks pairs, never splitting one (its loss needs both log-probs), one prompt per
chunk (a packed sequence of the prompt and the chosen and rejected completions of some of its pairs). Chunks are
filled first-fit decreasing. A prompt whose pairs fit one chunk with every activation kept gets one. Otherwise two
plans are weighed: the plain one (more chunks, each repeating the prompt in all three passes and paying its own
round of kernel launches), and the fewest chunks that fit with every decoder layer checkpointed, each then
checkpointing only as many of its layers as it needs to fit the budget (the first n: by the time the backward
reaches them the other layers' activations are freed, so their recompute adds nothing to the peak). A
checkpointed layer keeps only its input (`checkpoint_input_bytes`) and is recomputed in the backward: one more
forward of that layer. The cheaper plan in forward-token units wins: 4 per token (reference, forward, a backward
of two) plus n/L per token for n checkpointed layers of L. Checkpointing whole chunks only (as before) left a third
of the budget unused at mcts-real's shape (24.1 of 39.6 GiB) and recomputed every layer. A completion scored under
a grammar adds its allowed-token table and masked logits.

Estimate error: plans fill the budget up to HEADROOM_BYTES (2 GiB) below it. The per-token model errs high (GRPO
packed 35.5 GiB estimated, 34.9 measured; DPO fully checkpointed 25.7 / 24.1); the attention's transient is
quadratic in a chunk's length (ATTN_TRANSIENT_BYTES) and is counted, since without it a DPO chunk of ~4.5k tokens
planned 37.5 GiB ran out of memory at 39.6. So the 2 GiB are what the estimate may be low by (about 10 % of the
~20 GiB of activations and logits a chunk holds at mcts-real's shape) on top of the CUDA context and allocator
slack; an out-of-memory failure still falls back to the halving below.

An out-of-memory failure halves the chunk size for the retry of the same batch (a hint persisted under
HALO_HOME and carried in heartbeat details), so a retry never repeats the failure that preceded it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from . import paths
from .logprobs import PACK_ALIGN, hf_model

GIB = 1 << 30
# Bytes per hidden unit per decoder layer kept for the backward pass, per token (see the docstring).
ACT_BYTES_PER_UNIT_PACKED = 58.0
ACT_BYTES_PER_UNIT_PADDED = 78.0
# bf16 logits (2) + float32 log-softmax (4) + its gradient (4), per kept row and vocabulary entry.
LOGIT_BYTES = 10.0
# Grammar-masked logits: the bool allowed-token table (1) and the masked float32 copy (4).
GRAMMAR_LOGIT_BYTES = 5.0
# Gradient checkpointing: per decoder layer the bf16 input it is recomputed from (2 bytes per hidden unit, 3 with
# allocator slack), and the activations of the layer being recomputed and of the one its gradient flows into.
CHECKPOINT_BYTES_PER_UNIT_PER_LAYER = 3.0
CHECKPOINT_LAYERS_LIVE = 2
# The packed block mask made a (heads, S, S) bf16 buffer in the attention of a layer (measured: a 1.21 GiB allocation
# at S ~ 4.5k, 32 heads, H200, 2026-11-29): transient, but quadratic in the chunk's length, so a long DPO chunk planned
# without it ran out of memory. Two such buffers alive at once are allowed for.
ATTN_TRANSIENT_BYTES = 4.0
# CUDA context, allocator fragmentation and the no-grad reference pass's transient buffers.
HEADROOM_BYTES = 2 * GIB
DEFAULT_VLLM_UTILIZATION = 0.5


@dataclass
class MemoryModel:
    resident_bytes: int
    act_bytes_per_token: float  # every decoder layer's activations kept
    vocab: int
    layers: int = 1  # decoder layers
    checkpoint_input_bytes: float = 0.0  # per token and checkpointed layer: the input it is recomputed from
    heads: int = 0  # attention heads (the quadratic transient, ATTN_TRANSIENT_BYTES)

    @classmethod
    def from_policy(cls, policy, packed: bool = True) -> "MemoryModel":
        cfg = hf_model(policy).config.text_config
        unit = ACT_BYTES_PER_UNIT_PACKED if packed else ACT_BYTES_PER_UNIT_PADDED
        per_token = float(os.environ.get("HALO_ACT_BYTES_PER_TOKEN", 0)) or (
            unit * cfg.hidden_size * cfg.num_hidden_layers
        )
        if policy.device.type == "cuda":
            resident = torch.cuda.memory_allocated(policy.device)
        else:
            resident = sum(p.numel() * p.element_size() for p in policy.model.parameters())
        # AdamW keeps two float32 moments per trainable weight once it has stepped.
        resident += 2 * sum(p.numel() * 4 for p in policy.trainable_parameters().values())
        return cls(
            resident_bytes=int(resident),
            act_bytes_per_token=per_token,
            vocab=cfg.vocab_size,
            layers=cfg.num_hidden_layers,
            checkpoint_input_bytes=CHECKPOINT_BYTES_PER_UNIT_PER_LAYER * cfg.hidden_size,
            heads=cfg.num_attention_heads,
        )

    def bytes_per_token(self, checkpointed_layers: int = 0) -> float:
        """Activations kept per token with the first `checkpointed_layers` decoder layers checkpointed: their inputs,
        the other layers' activations, and while a checkpointed layer is recomputed, it and the one its gradient
        flows into (by then the others are freed)."""
        n = min(max(checkpointed_layers, 0), self.layers)
        if n == 0:
            return self.act_bytes_per_token
        layer = self.act_bytes_per_token / self.layers
        return n * self.checkpoint_input_bytes + max(self.layers - n, CHECKPOINT_LAYERS_LIVE) * layer

    def chunk_bytes(self, tokens: int, kept: int, constrained: bool = False, checkpointed_layers: int = 0) -> float:
        logit = LOGIT_BYTES + (GRAMMAR_LOGIT_BYTES if constrained else 0.0)
        attention = ATTN_TRANSIENT_BYTES * self.heads * tokens * tokens
        return (
            self.resident_bytes
            + self.bytes_per_token(checkpointed_layers) * tokens
            + logit * kept * self.vocab
            + attention
        )


def budget_bytes(device: torch.device) -> int | None:
    """HALO_LEARNER_MEMORY_GB, else what vLLM at HALO_VLLM_GPU_UTILIZATION (0.5) leaves of the GPU; CPU: none."""
    env = os.environ.get("HALO_LEARNER_MEMORY_GB")
    if env:
        return int(float(env) * GIB)
    if device.type != "cuda":
        return None
    share = float(os.environ.get("HALO_VLLM_GPU_UTILIZATION", DEFAULT_VLLM_UTILIZATION))
    return int(torch.cuda.get_device_properties(device).total_memory * (1 - share))


@dataclass
class Plan:
    micro_batch: int
    peak_bytes: float  # estimated peak of the largest chunk
    budget_bytes: int | None
    fits: bool  # False: even one completion per chunk is estimated over budget (tried anyway)


def _chunk_shape(prompt_len: int, lens: list[int], packed: bool) -> tuple[int, int]:
    """(tokens in the forward, logits rows kept) of one chunk."""
    if packed:
        body = sum(n - 1 for n in lens)
        return prompt_len + body + (-(prompt_len + body)) % PACK_ALIGN, body + 1
    L = max(lens)
    return len(lens) * (prompt_len + L), len(lens) * (L + 1)


def plan_micro_batch(
    groups: list[tuple[int, list[int]]], cap: int, budget: int | None, model: MemoryModel, packed: bool = True
) -> Plan:
    """The largest chunk size <= cap whose worst chunk fits the budget.

    `groups`: (prompt tokens, completion lengths) per prompt group, in batch order. Packed chunks are
    consecutive completions of one group; padded chunks are consecutive rows of the whole batch.
    """
    # A chunk never holds more than a group (packed) or the batch (padded), so a larger size says nothing.
    cap = max(1, min(cap, max(len(lens) for _, lens in groups) if packed else sum(len(lens) for _, lens in groups)))
    worst = 0.0
    for k in range(cap, 0, -1):
        if packed:
            chunks = [(p, lens[s : s + k]) for p, lens in groups for s in range(0, len(lens), k)]
        else:
            rows = [(p, n) for p, lens in groups for n in lens]
            chunks = [
                (max(p for p, _ in rows[s : s + k]), [n for _, n in rows[s : s + k]]) for s in range(0, len(rows), k)
            ]
        worst = max(model.chunk_bytes(*_chunk_shape(p, lens, packed)) for p, lens in chunks)
        if budget is None or worst + HEADROOM_BYTES <= budget:
            return Plan(micro_batch=k, peak_bytes=worst, budget_bytes=budget, fits=True)
    return Plan(micro_batch=1, peak_bytes=worst, budget_bytes=budget, fits=False)


@dataclass
class PairShape:
    """What planning needs of a DPO pair: its prompt group, prompt tokens, completion lengths, grammar masks."""

    group: str
    prompt_len: int
    chosen_len: int
    rejected_len: int
    constrained: bool = False


@dataclass
class DpoGroupPlan:
    chunks: list[list[int]]  # pair indices per packed sequence (reference pass, then forward+backward)
    layers: list[int] | None = None  # per chunk: its first n decoder layers checkpointed (None: none)

    def checkpointed_layers(self, i: int) -> int:
        return self.layers[i] if self.layers else 0

    @property
    def checkpointed(self) -> bool:
        return any(self.layers or ())


@dataclass
class DpoPlan:
    groups: list[DpoGroupPlan]  # one per prompt, in order of first appearance
    pairs_per_chunk: int  # the largest chunk (what an out-of-memory hint caps)
    peak_bytes: float  # estimated peak of the costliest chunk
    budget_bytes: int | None
    fits: bool  # False: some single pair is estimated over budget (tried anyway)
    decoder_layers: int = 1

    @property
    def chunks(self) -> int:
        return sum(len(g.chunks) for g in self.groups)

    @property
    def checkpointed(self) -> int:
        """Chunks with any layer checkpointed."""
        return sum(1 for g in self.groups for i in range(len(g.chunks)) if g.checkpointed_layers(i))

    def to_json(self) -> dict:
        return dict(
            groups=[{"chunks": g.chunks, "layers": g.layers} for g in self.groups],
            pairs_per_chunk=self.pairs_per_chunk,
            peak_bytes=self.peak_bytes,
            budget_bytes=self.budget_bytes,
            fits=self.fits,
            decoder_layers=self.decoder_layers,
        )

    @classmethod
    def from_json(cls, d: dict) -> "DpoPlan":
        return cls(**{**d, "groups": [DpoGroupPlan(g["chunks"], g["layers"]) for g in d["groups"]]})

    @property
    def recomputed_layers(self) -> int:
        """Decoder layers recomputed over the whole update (a chunk's checkpointed layers, summed)."""
        return sum(g.checkpointed_layers(i) for g in self.groups for i in range(len(g.chunks)))


def _pair_chunk_tokens(pairs: list[PairShape], rows: list[int]) -> tuple[int, int]:
    lens = [n for r in rows for n in (pairs[r].chosen_len, pairs[r].rejected_len)]
    return _chunk_shape(pairs[rows[0]].prompt_len, lens, True)


def _pair_chunk_cost(model: MemoryModel, pairs: list[PairShape], rows: list[int], packed: bool, ckpt: int) -> float:
    constrained = any(pairs[r].constrained for r in rows)
    if packed:
        return model.chunk_bytes(*_pair_chunk_tokens(pairs, rows), constrained, ckpt)
    # Unpacked (group_logprobs): the prompt once, its KV expanded under 2k right-padded completion rows.
    lens = [n for r in rows for n in (pairs[r].chosen_len, pairs[r].rejected_len)]
    L = max(lens)
    return model.chunk_bytes(pairs[rows[0]].prompt_len + len(lens) * L, len(lens) * (L + 1), constrained)


def _first_fit(rows: list[int], size, cap: int, fits) -> list[list[int]]:
    """First-fit decreasing: the longest pairs first, each into the first chunk it fits; chunks in batch order."""
    bins: list[list[int]] = []
    for r in sorted(rows, key=lambda r: (-size(r), r)):
        for b in bins:
            if len(b) < cap and fits(b + [r]):
                b.append(r)
                break
        else:
            bins.append([r])
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def forward_units(tokens: int, checkpointed_layers: int, layers: int) -> float:
    """A chunk's compute in token-forwards: reference, forward and a backward of two, plus the recomputed layers."""
    return tokens * (4.0 + checkpointed_layers / max(layers, 1))


def plan_dpo(pairs: list[PairShape], cap: int, budget: int | None, model: MemoryModel, packed: bool = True) -> DpoPlan:
    """Chunks of a DPO batch under the budget (see the module's docstring), at most `cap` pairs each.

    Unpacked (the baseline): the largest uniform number of consecutive pairs of a prompt whose worst chunk fits.
    """
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(p.group, []).append(i)
    L = max(model.layers, 1)

    def fits(rows: list[int], ckpt: int = 0) -> bool:
        return budget is None or _pair_chunk_cost(model, pairs, rows, packed, ckpt) + HEADROOM_BYTES <= budget

    def size(r: int) -> int:
        return pairs[r].chosen_len + pairs[r].rejected_len

    def least_layers(rows: list[int]) -> int:
        """The fewest checkpointed layers with which the chunk fits (the most that help when none does)."""
        # Past L - CHECKPOINT_LAYERS_LIVE a further checkpointed layer saves nothing: two stay live in the recompute.
        lo, hi = 0, L - CHECKPOINT_LAYERS_LIVE if L > CHECKPOINT_LAYERS_LIVE else L
        while lo < hi:  # below hi the estimate falls as n grows (a checkpointed layer keeps less than a whole one)
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(rows, mid) else (mid + 1, hi)
        return lo

    def units(chunks: list[list[int]], layers: list[int]) -> float:
        return sum(forward_units(_pair_chunk_tokens(pairs, c)[0], n, L) for c, n in zip(chunks, layers))

    cap = max(1, cap)
    out: list[DpoGroupPlan] = []
    if packed:
        for rows in groups.values():
            plain = _first_fit(rows, size, cap, fits)
            if len(plain) == 1:
                out.append(DpoGroupPlan(plain))
                continue
            fewer = _first_fit(rows, size, cap, lambda b: fits(b, L))
            layers = [least_layers(c) for c in fewer]
            # A plain plan whose chunk (a single pair) does not fit is no option, however cheap.
            better = not all(fits(c) for c in plain) or units(fewer, layers) < units(plain, [0] * len(plain))
            out.append(DpoGroupPlan(fewer, layers) if better else DpoGroupPlan(plain))
    else:
        k = cap
        while True:
            chunks = [[rows[s : s + k] for s in range(0, len(rows), k)] for rows in groups.values()]
            if k == 1 or all(fits(c) for cs in chunks for c in cs):
                break
            k -= 1
        out = [DpoGroupPlan(cs) for cs in chunks]
    peak = max(
        _pair_chunk_cost(model, pairs, c, packed, g.checkpointed_layers(i)) for g in out for i, c in enumerate(g.chunks)
    )
    return DpoPlan(
        groups=out,
        pairs_per_chunk=max(len(c) for g in out for c in g.chunks),
        peak_bytes=peak,
        budget_bytes=budget,
        fits=budget is None or peak + HEADROOM_BYTES <= budget,
        decoder_layers=L,
    )


class OomHints:
    """batch_ref -> the largest chunk size still allowed, after out-of-memory failures on that batch."""

    def __init__(self, path: Path | None = None):
        self.path = path or paths.halo_home() / "learner" / "oom-hints.json"

    def _read(self) -> dict[str, int]:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def cap(self, batch_ref: str) -> int | None:
        return self._read().get(batch_ref)

    def shrink(self, batch_ref: str, failed_at: int) -> int | None:
        """Record an OOM at chunk size `failed_at`; returns the next size to try, None when 1 already failed."""
        if failed_at <= 1:
            return None
        nxt = failed_at // 2
        hints = self._read()
        hints[batch_ref] = min(nxt, hints.get(batch_ref, nxt))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".oom-hints-")
        with os.fdopen(fd, "w") as f:
            json.dump(hints, f)
        os.replace(tmp, self.path)
        return hints[batch_ref]
