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
# CUDA context, allocator fragmentation and the no-grad reference pass's transient buffers.
HEADROOM_BYTES = 2 * GIB
DEFAULT_VLLM_UTILIZATION = 0.5


@dataclass
class MemoryModel:
    resident_bytes: int
    act_bytes_per_token: float
    vocab: int

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
        return cls(resident_bytes=int(resident), act_bytes_per_token=per_token, vocab=cfg.vocab_size)

    def chunk_bytes(self, tokens: int, kept: int) -> float:
        return self.resident_bytes + self.act_bytes_per_token * tokens + LOGIT_BYTES * kept * self.vocab


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
