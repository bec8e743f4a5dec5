"""The checks of the learner contract that JSON Schema cannot state, as base classes of the generated models.

payloads.py is generated from the zod schemas (lib/training/learner-types.ts, lib/training/experience.ts): fields, limits, patterns and
defaults come from there. What a zod `refine` checks across fields, and zod's rule that a number is finite where the
learner depends on it, is written here once more, next to the model it belongs to; the contract test
(test/integration/learner-contract.test.ts) gives both sides the same payloads and expects the same verdicts.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

# vLLM clamps a log-prob to max(lp, -9999.0): -inf (a token masked out) or nothing measured comes back as this.
UNKNOWN_LOGPROB_FLOOR = -9999.0


class ContractModel(BaseModel):
    # Unknown keys are rejected: a misspelt hyperparameter must fail loudly, not train with a default.
    model_config = ConfigDict(extra="forbid")


class SampledTokensRules(ContractModel):
    """The blob behind a tokens_ref: the sampled ids (end-of-turn token included) and the log-prob of each."""

    @model_validator(mode="after")
    def _paired(self):
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries but token_ids has {len(self.token_ids)}")
        return self

    def known_logprobs(self) -> tuple[list[float | None] | None, int]:
        """The log-probs with every unknown entry as None, and how many are unknown.

        A null entry is unknown (vLLM's -9999 placeholder, or none reported); so is a number at or below
        UNKNOWN_LOGPROB_FLOOR in blobs written before the entries could be null."""
        if self.logprobs is None:
            return None, 0
        out = [
            None if lp is None or not math.isfinite(lp) or lp <= UNKNOWN_LOGPROB_FLOOR else lp for lp in self.logprobs
        ]
        return out, sum(lp is None for lp in out)


class GrpoItemRules(ContractModel):
    # zod's numbers are finite; pydantic's floats take inf and nan, and an infinite advantage would reach every token.
    @field_validator("advantage", check_fields=False)
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("advantage must be finite")
        return v


class DpoPairRules(ContractModel):
    @model_validator(mode="after")
    def _both_refs_or_none(self):
        if (self.ref_chosen_logprob is None) != (self.ref_rejected_logprob is None):
            raise ValueError("give both ref_chosen_logprob and ref_rejected_logprob, or neither")
        return self


class CompletionRules(ContractModel):
    @model_validator(mode="after")
    def _tokens_once(self):
        inline = self.token_ids is not None and self.logprobs is not None
        if inline == (self.tokens_ref is not None) or (self.token_ids is None) != (self.logprobs is None):
            raise ValueError("a completion carries its tokens either inline (token_ids and logprobs) or as tokens_ref")
        return self
