"""From a batch blob to the samples an update trains on (DPO pairs here; GRPO items in learner.py).

A DPO pair's completions are the sampler's own tokens when the pair references them (`chosen_tokens_ref` /
`rejected_tokens_ref`, SampledTokens blobs); only a pair without them is scored on its retokenised text, and
every completion that was is counted (with the share whose retokenisation may not be what was sampled). Tokens
sampled under a grammar (the blob's `grammar_ref`) come with that grammar's per-position masks, so the update
scores them over the same support the sampler drew from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .dpo import DpoSample
from .payloads import DpoBatch, SampledTokens
from .prompts import PromptCache, completion_ids_from_text, prompt_key


class InvalidBatch(ValueError):
    pass


@dataclass
class PreparedDpo:
    samples: list[DpoSample]
    retokenized: int  # completions scored on retokenised text (no tokens_ref)
    mismatched: int  # of those, retokenisations that may differ from what was sampled
    constrained: int  # completions scored under their grammar's masks


def dpo_samples(
    batch: DpoBatch,
    prompts: PromptCache,
    tokenizer,
    sampled_tokens: Callable[[str, str], SampledTokens],
    grammar_bitmask: Callable[[str, list[int]], torch.Tensor],
    on_item: Callable[[], None] | None = None,
) -> PreparedDpo:
    """`sampled_tokens(ref, where)` reads and checks a token blob; `grammar_bitmask(grammar_ref, ids)` gives the
    masks of ids sampled under that grammar (raising ValueError when they are not a path through it)."""
    vocab = len(tokenizer)
    out = PreparedDpo(samples=[], retokenized=0, mismatched=0, constrained=0)
    for i, p in enumerate(batch.pairs):
        enc = prompts.get(p.prompt)
        sides = {}
        for side, text, ref in (
            ("chosen", p.chosen, p.chosen_tokens_ref),
            ("rejected", p.rejected, p.rejected_tokens_ref),
        ):
            where = f"pairs[{i}].{side}_tokens_ref"
            bitmask = None
            if ref is None:
                r = completion_ids_from_text(tokenizer, enc.text, text, True)
                ids = r.ids
                out.retokenized += 1
                out.mismatched += r.mismatch
            else:
                sampled = sampled_tokens(ref, where)
                ids = list(sampled.token_ids)
                if max(ids) >= vocab:
                    raise InvalidBatch(f"{where} {ref} has ids outside the vocabulary (0..{vocab - 1})")
                if sampled.grammar_ref:
                    try:
                        bitmask = grammar_bitmask(sampled.grammar_ref, ids)
                    except ValueError as e:
                        raise InvalidBatch(f"{where}: {e}") from e
                    out.constrained += 1
            sides[side] = (ids, bitmask)
        out.samples.append(
            DpoSample(
                prompt=enc,
                prompt_key=prompt_key(p.prompt),
                chosen=sides["chosen"][0],
                rejected=sides["rejected"][0],
                ref_chosen=p.ref_chosen_logprob,
                ref_rejected=p.ref_rejected_logprob,
                chosen_bitmask=sides["chosen"][1],
                rejected_bitmask=sides["rejected"][1],
            )
        )
        if on_item:
            on_item()
    return out
