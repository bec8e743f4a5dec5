"""Pydantic schemas of the activity inputs/outputs and batch blobs (snake_case, shared with the TS zod schemas).

The TypeScript side is lib/learner-types.ts, and for what is experience (the prompt, the sampler's tokens, the
DPO pair) lib/experience.ts; test/integration/learner-contract.test.ts compares the two field by field.
Unknown keys are rejected: a misspelt hyperparameter must fail loudly, not train with a default.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .paths import RUN_ID_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---- prompts (written by lib/prompt.ts) ----------------------------------------------------------


class TextPart(_Strict):
    type: Literal["text"]
    text: str


BLOB_REF_PATTERN = r"^sha256:[0-9a-f]{64}\.[a-z0-9]{1,8}$"
BlobRef = Annotated[str, Field(pattern=BLOB_REF_PATTERN)]


class ImagePart(_Strict):
    type: Literal["image"]
    ref: BlobRef


PromptPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class PromptMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: list[PromptPart] = Field(min_length=1)


Prompt = Annotated[list[PromptMessage], Field(min_length=1)]


# ---- the sampler's tokens (lib/experience.ts SampledTokens) --------------------------------------


# vLLM clamps a log-prob to max(lp, -9999.0): -inf (a token masked out) or nothing measured comes back as this.
UNKNOWN_LOGPROB_FLOOR = -9999.0


class SampledTokens(_Strict):
    """The blob behind a tokens_ref: the sampled ids (end-of-turn token included) and the log-prob of each, after
    temperature (vLLM's processed_logprobs, or sampling.py), as the sampler wrote them."""

    token_ids: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    # Null when the server gave ids without log-probs: the update then has no sampler log-probs (ratio 1).
    # A null entry is one unknown log-prob (vLLM's -9999 placeholder, or none reported); so is a number at or below
    # UNKNOWN_LOGPROB_FLOOR in blobs written before the entries could be null. See known_logprobs.
    logprobs: list[float | None] | None = None
    # Written by the colocated sampler: the grammar the tokens were sampled under (constrained decoding).
    grammar_ref: str | None = None
    # The prompt token ids the server encoded for this request (a PromptTokenIds blob), to compare with the
    # learner's own encoding of the stored prompt.
    prompt_ref: BlobRef | None = None

    @model_validator(mode="after")
    def _paired(self) -> "SampledTokens":
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries but token_ids has {len(self.token_ids)}")
        return self

    def known_logprobs(self) -> tuple[list[float | None] | None, int]:
        """The log-probs with every unknown entry as None, and how many are unknown."""
        if self.logprobs is None:
            return None, 0
        out = [
            None if lp is None or not math.isfinite(lp) or lp <= UNKNOWN_LOGPROB_FLOOR else lp for lp in self.logprobs
        ]
        return out, sum(lp is None for lp in out)


class PromptTokenIds(_Strict):
    """The blob behind a SampledTokens prompt_ref: vLLM's `prompt_token_ids` of the request."""

    prompt_token_ids: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)


# ---- update_policy -------------------------------------------------------------------------------


class GrpoHyperparameters(_Strict):
    learning_rate: float = Field(1e-6, gt=0)
    kl_coef: float = Field(0.001, ge=0)
    clip_epsilon: float = Field(0.2, gt=0, lt=1)
    temperature: float = Field(0.7, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    loss_type: str = "dr_grpo"
    # Set: the decoupled objective (grpo.py), importance weights to the sampler capped here. The trainer sets it for
    # served samples, pipelined iterations and exploring draws: every sampler that is not the learner itself.
    stale_weight_cap: float | None = Field(None, gt=0)

    @field_validator("loss_type")
    @classmethod
    def _only_dr_grpo(cls, v: str) -> str:
        if v != "dr_grpo":
            raise ValueError(f"loss_type {v!r} is not supported; the learner implements 'dr_grpo' only")
        return v


class GrpoItem(_Strict):
    prompt: Prompt
    completion: str
    # The sampler's tokens of the completion, a SampledTokens blob the learner reads and checks; null: the learner
    # retokenises the text (a server that gave no ids, an invalid output) and has no sampler log-probs for it.
    tokens_ref: BlobRef | None = None
    advantage: float
    # Optional: when the sampler stopped on max_tokens the text has no end-of-turn token to learn.
    finish_reason: str | None = None
    # Constrained decoding: the JSON-schema blob the completion was sampled under (lib/action-grammar.ts); the
    # learner applies the same mask when it recomputes log-probs.
    grammar_ref: str | None = None

    @field_validator("advantage")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("advantage must be finite")
        return v


class GrpoBatch(_Strict):
    items: list[GrpoItem] = Field(min_length=1)
    # The run's policy.maxTokens: dr_grpo divides by B x this constant, so per-token weight does not move
    # between batches. Null falls back to the batch's longest completion (logged as a warning).
    max_completion_len: int | None = Field(None, ge=1)


# The resident model a request was written for (the run's policy model, e.g. "Qwen/Qwen3-VL-8B-Instruct").
# Null skips the check; a mismatch is a non-retryable ModelMismatch.
ModelId = Annotated[str, Field(min_length=1)] | None


class UpdatePolicyInput(_Strict):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    version: int = Field(ge=1)
    batch_ref: str
    hyperparameters: GrpoHyperparameters = GrpoHyperparameters()
    base_model: ModelId = None


class UpdateOutput(_Strict):
    run_id: str
    version: int
    adapter_path: str
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    reused: bool


class UpdatePolicyOutput(UpdateOutput):
    # Items trained on retokenised text (the sampler gave no token ids), and the share of them whose
    # retokenisation is not a faithful stand-in for what was sampled (their old log-probs are not used).
    retokenized: int
    token_mismatch_rate: float
    # Sampler tokens whose log-prob was unknown (dropped from the loss), and the share of the
    # completions with the server's prompt ids whose ids differ from the learner's encoding; null: written before.
    unknown_logprobs: int | None = None
    prompt_mismatch_rate: float | None = None
    # Per-update statistics (TRL / CleanRL style), measured before the optimiser step; null when unknown
    # (kl without a reference pass, ratio figures without sampler log-probs, versions written before them).
    kl: float | None = None  # mean k3 estimate of KL(pi_theta || pi_ref) per completion token
    # share of ratio tokens whose clipped ratio (to the sampler; decoupled: to the proximal policy, so 0 before the
    # step) is outside [1 - eps, 1 + eps]
    clip_fraction: float | None = None
    mean_ratio: float | None = None  # mean pi_theta / pi_old over tokens with sampler log-probs
    ratio_tokens: int | None = None  # completion tokens that came with sampler log-probs
    entropy: float | None = None  # mean -log pi_theta(sampled token): a one-sample entropy estimate
    denominator: float | None = None  # dr_grpo's B x max_completion_len
    micro_batch: int | None = None  # completions per packed forward, as planned for the memory budget


# ---- update_dpo ----------------------------------------------------------------------------------


class DpoHyperparameters(_Strict):
    learning_rate: float = Field(1e-6, gt=0)
    beta: float = Field(0.1, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)


class DpoPair(_Strict):
    # The reference is always the adapter-disabled base model (dpo.py); logged reference log-probs are
    # accepted for older writers and ignored, so one batch never mixes two references.
    prompt: Prompt
    chosen: str
    rejected: str
    # The sampler's tokens of each completion when the search sampled them (SampledTokens blobs): the update
    # scores those ids, under the blob's grammar_ref masks when it has one; null: it retokenises the text.
    chosen_tokens_ref: BlobRef | None = None
    rejected_tokens_ref: BlobRef | None = None
    ref_chosen_logprob: float | None = None
    ref_rejected_logprob: float | None = None

    @model_validator(mode="after")
    def _both_refs_or_none(self) -> "DpoPair":
        if (self.ref_chosen_logprob is None) != (self.ref_rejected_logprob is None):
            raise ValueError("give both ref_chosen_logprob and ref_rejected_logprob, or neither")
        return self


class DpoBatch(_Strict):
    pairs: list[DpoPair] = Field(min_length=1)


class UpdateDpoInput(_Strict):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    version: int = Field(ge=1)
    batch_ref: str
    hyperparameters: DpoHyperparameters = DpoHyperparameters()
    base_model: ModelId = None


class UpdateDpoOutput(UpdateOutput):
    reward_margin: float
    accuracy: float


# ---- sample_actions ------------------------------------------------------------------------------


class SampleActionsInput(_Strict):
    run_id: str = Field(pattern=RUN_ID_PATTERN)
    version: int = Field(0, ge=0)
    prompt_ref: str
    n: int = Field(1, ge=1, le=64)
    temperature: float = Field(0.7, ge=0)
    max_tokens: int = Field(256, ge=1)
    seed: int | None = None
    # ε of the exploring draw (sampling.py): tokens from (1 − ε)·π + ε·uniform(allowed), log-probs of that mixture.
    explore: float = Field(0.0, ge=0, le=1)
    base_model: ModelId = None
    # Constrained decoding: the JSON-schema blob every completion must follow (grammar.py).
    grammar_ref: str | None = None
    # Each completion's token ids and log-probs go to a blob and only its reference comes back: n × max_tokens
    # ids and log-probs inline would swell the history of every workflow that carries them.
    store_tokens: bool = False


class Completion(_Strict):
    text: str
    # Inline (store_tokens off), or in the blob at tokens_ref: {token_ids, logprobs, grammar_ref}.
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens_ref: str | None = None
    # Sum of the log-probs (either way): MCTS keeps it as the DPO reference log-prob of the completion.
    logprob_sum: float | None = None
    finish_reason: Literal["stop", "length"]

    @model_validator(mode="after")
    def _tokens_once(self):
        inline = self.token_ids is not None and self.logprobs is not None
        if inline == (self.tokens_ref is not None) or (self.token_ids is None) != (self.logprobs is None):
            raise ValueError("a completion carries its tokens either inline (token_ids and logprobs) or as tokens_ref")
        return self


class SampleActionsOutput(_Strict):
    completions: list[Completion]
    model: str
    version: int
    seconds: float
    # How many sample_actions calls were sampled together in this call's batch (sample_batcher.py).
    batch_calls: int = Field(1, ge=1)
