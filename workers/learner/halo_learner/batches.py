"""From a batch blob to the samples an update trains on (GRPO items and DPO pairs).

A GRPO item's sampler log-probs may be unknown at some positions (vLLM's -9999 placeholder, or none reported):
the update drops those positions from the loss (grpo.py), counts them and warns once per batch. When the sampler recorded the
prompt ids the server encoded (the token blob's `prompt_ref`), they are compared with the learner's own encoding
of the stored prompt; a difference is counted and the first one logged, and the item is still scored on the
learner's encoding (the chat template and image processor that training uses), with the sampler's log-probs.

A DPO pair's completions are the sampler's own tokens when the pair references them (`chosen_tokens_ref` /
`rejected_tokens_ref`, SampledTokens blobs); only a pair without them is scored on its retokenised text, and
every completion that was is counted (with the share whose retokenisation may not be what was sampled). Tokens
sampled under a grammar (the blob's `grammar_ref`) come with that grammar's per-position masks, so the update
scores them over the same support the sampler drew from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from .dpo import DpoSample
from .grpo import GrpoSample
from .payloads import DpoBatch, GrpoBatch, SampledTokens
from .prompts import (
    PromptCache,
    PromptIdsMismatch,
    Retokenized,
    compare_prompt_ids,
    completion_ids_from_text,
    prompt_key,
)

log = logging.getLogger("halo_learner")


class InvalidBatch(ValueError):
    pass


# An item whose prompt ids differ from the server's in more than this share of the prompt is not trained on: its
# log-probs would be scored on another input than the one sampled from (a different image size or chat template),
# and its ratio to the sampler would be noise. Below it (a merged space, a neutralised spelling) it is scored on the
# learner's encoding and counted.
PROMPT_DIFF_LIMIT = 0.05


@dataclass
class PreparedGrpo:
    samples: list[GrpoSample]
    retokenized: int  # items trained on retokenised text (no tokens_ref)
    mismatched: int  # of those, retokenisations that may differ from what was sampled
    unknown_logprobs: int = 0  # sampler tokens whose log-prob is unknown: dropped from the loss
    prompts_compared: int = 0  # items whose token blob carried the server's prompt ids
    prompts_mismatched: int = 0  # of those, prompts the learner encodes to other ids
    first_prompt_mismatch: tuple[int, PromptIdsMismatch] | None = None  # (item, where)
    prompts_dropped: int = 0  # of the mismatched, items left out: more than PROMPT_DIFF_LIMIT of the prompt differs
    first_dropped: tuple[int, PromptIdsMismatch] | None = None
    unknown_items: int = 0  # items with at least one unknown sampler log-prob
    first_unknown: int | None = None  # the first such item

    @property
    def token_mismatch_rate(self) -> float:
        return self.mismatched / self.retokenized if self.retokenized else 0.0

    @property
    def prompt_mismatch_rate(self) -> float | None:
        # None when no item carried the server's prompt ids (colocated sampling): nothing was compared, and a 0
        # would read as "every prompt matched".
        return self.prompts_mismatched / self.prompts_compared if self.prompts_compared else None


def grpo_samples(
    batch: GrpoBatch,
    prompts: PromptCache,
    tokenizer,
    sampled_tokens: Callable[[str, str], SampledTokens],
    prompt_token_ids: Callable[[str, str], list[int]],
    grammar_bitmask: Callable[[str, list[int]], torch.Tensor],
    on_item: Callable[[], None] | None = None,
    retokenise: Callable[..., Retokenized] = completion_ids_from_text,
) -> PreparedGrpo:
    """`sampled_tokens(ref, where)` / `prompt_token_ids(ref, where)` read and check a token / prompt-ids blob (an
    InvalidBatch naming `where` when malformed); `grammar_bitmask` as for dpo_samples; `retokenise` gives the ids
    of a text-only item (the caller's, so a caller that wraps it sees every item it decides)."""
    vocab = len(tokenizer)
    out = PreparedGrpo(samples=[], retokenized=0, mismatched=0)
    for i, it in enumerate(batch.items):
        prompt = prompts.get(it.prompt)
        if it.tokens_ref is not None:
            sampled = sampled_tokens(it.tokens_ref, f"items[{i}].tokens_ref")
            ids = list(sampled.token_ids)
            old, _ = sampled.known_logprobs()
            if max(ids) >= vocab:
                raise InvalidBatch(
                    f"items[{i}].tokens_ref {it.tokens_ref} has ids outside the vocabulary (0..{vocab - 1})"
                )
            if sampled.prompt_ref is not None:
                server = prompt_token_ids(sampled.prompt_ref, f"items[{i}].tokens_ref.prompt_ref")
                diff = compare_prompt_ids(tokenizer, server, prompt.input_ids.tolist())
                out.prompts_compared += 1
                if diff is not None:
                    out.prompts_mismatched += 1
                    out.first_prompt_mismatch = out.first_prompt_mismatch or (i, diff)
                    if diff.fraction > PROMPT_DIFF_LIMIT:
                        out.prompts_dropped += 1
                        out.first_dropped = out.first_dropped or (i, diff)
                        if on_item:
                            on_item()
                        continue
        else:
            r = retokenise(tokenizer, prompt.text, it.completion, end_of_turn=it.finish_reason != "length")
            ids, old = r.ids, None
            out.retokenized += 1
            out.mismatched += r.mismatch
        if batch.max_completion_len is not None and len(ids) > batch.max_completion_len:
            ids = ids[: batch.max_completion_len]
            old = old[: batch.max_completion_len] if old is not None else None
        if old is not None:
            unknown = sum(lp is None for lp in old)
            out.unknown_logprobs += unknown
            if unknown:
                out.unknown_items += 1
                out.first_unknown = out.first_unknown if out.first_unknown is not None else i
        try:
            bitmask = grammar_bitmask(it.grammar_ref, ids) if it.grammar_ref else None
        except ValueError as e:
            raise InvalidBatch(f"items[{i}]: {e}") from e
        out.samples.append(
            GrpoSample(
                prompt=prompt,
                prompt_key=prompt_key(it.prompt),
                ids=ids,
                advantage=it.advantage,
                old_logprobs=old,
                bitmask=bitmask,
            )
        )
        if on_item:
            on_item()
    if out.unknown_logprobs:
        # A healthy server scores every token it sampled: -9999 means it sampled what it scored as impossible.
        log.warning(
            "%d sampler tokens in %d of %d items have no log-prob (vLLM's -9999 placeholder or none reported, first "
            "in items[%d]): dropped from the loss",
            out.unknown_logprobs,
            out.unknown_items,
            len(batch.items),
            out.first_unknown,
        )
    if out.first_prompt_mismatch is not None:
        item, diff = out.first_prompt_mismatch
        log.warning(
            "%d of %d completions were sampled on prompt ids that differ from the learner's encoding (%d dropped, "
            "the rest scored on the learner's); items[%d]: %s",
            out.prompts_mismatched,
            out.prompts_compared,
            out.prompts_dropped,
            item,
            diff.describe(),
        )
    if out.first_dropped is not None:
        item, diff = out.first_dropped
        reason = (
            f"{out.prompts_dropped} of {len(batch.items)} items dropped: their prompt ids differ from the learner's "
            f"encoding in more than {PROMPT_DIFF_LIMIT:.0%} of the prompt, so the sampler's log-probs are of another "
            f"input (image size, image processor or chat template differ between server and learner); "
            f"items[{item}]: {diff.describe()}"
        )
        if not out.samples:
            raise InvalidBatch(f"nothing to train on: {reason}")
        log.warning("%s", reason)
    return out


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
                # DPO uses no sampler log-probs (unknown entries are simply never read) and does not compare the
                # blob's prompt_ref: pairs are scored on the learner's encoding, the reference pass on the same.
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
