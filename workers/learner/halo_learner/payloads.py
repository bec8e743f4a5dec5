# Generated from lib/training/learner-types.ts by `npx halo learner-schema --write`: do not edit (test/unit/learner-schema.test.ts).
#
# The learner contract as pydantic models: snake_case keys, unknown keys rejected, the limits, patterns and defaults of
# the zod schemas. The checks JSON Schema cannot state come from each model's base class in payload_rules.py.

from __future__ import annotations

from typing import Annotated, Literal
from halo_learner.payload_rules import CompletionRules, ContractModel, DpoPairRules, GrpoItemRules, SampledTokensRules
from pydantic import ConfigDict, Field
from typing_extensions import TypeAliasType


class TextPart(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    type: Literal["text"]
    text: str


class ImagePart(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    type: Literal["image"]
    ref: Annotated[str, Field(pattern="^sha256:[0-9a-f]{64}\\.[a-z0-9]{1,8}$")]


PromptPart = TypeAliasType("PromptPart", Annotated[TextPart | ImagePart, Field(discriminator="type")])


class PromptMessage(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    role: Literal["system", "user", "assistant"]
    content: Annotated[list[PromptPart], Field(min_length=1)]


Prompt = TypeAliasType("Prompt", Annotated[list[PromptMessage], Field(min_length=1)])


TokenId = TypeAliasType("TokenId", Annotated[int, Field(ge=0)])


class SampledTokens(SampledTokensRules):
    model_config = ConfigDict(
        extra="forbid",
    )
    token_ids: Annotated[list[TokenId], Field(min_length=1)]
    logprobs: list[float | None] | None = None
    grammar_ref: str | None = None
    prompt_ref: Annotated[str | None, Field(pattern="^sha256:[0-9a-f]{64}\\.[a-z0-9]{1,8}$")] = None


PromptTokenId = TypeAliasType("PromptTokenId", Annotated[int, Field(ge=0)])


class PromptTokenIds(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    prompt_token_ids: Annotated[list[PromptTokenId], Field(min_length=1)]


class GrpoHyperparameters(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    learning_rate: Annotated[float, Field(gt=0.0)] = 1e-06
    kl_coef: Annotated[float, Field(ge=0.0)] = 0.001
    clip_epsilon: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    temperature: Annotated[float, Field(gt=0.0)] = 0.7
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 1
    loss_type: Literal["dr_grpo"] = "dr_grpo"
    stale_weight_cap: Annotated[float | None, Field(gt=0.0)] = None


class GrpoItem(GrpoItemRules):
    model_config = ConfigDict(
        extra="forbid",
    )
    prompt: Prompt
    completion: str
    tokens_ref: Annotated[str | None, Field(pattern="^sha256:[0-9a-f]{64}\\.[a-z0-9]{1,8}$")] = None
    advantage: float
    finish_reason: str | None = None
    grammar_ref: str | None = None


class GrpoBatch(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    items: Annotated[list[GrpoItem], Field(min_length=1)]
    max_completion_len: Annotated[int | None, Field(ge=1)] = None


class UpdatePolicyInput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    run_id: Annotated[str, Field(min_length=1, pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")]
    version: Annotated[int, Field(ge=1)]
    batch_ref: str
    hyperparameters: Annotated[GrpoHyperparameters, Field(validate_default=True)] = {}
    base_model: Annotated[str | None, Field(min_length=1)] = None


class UpdatePolicyOutput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    run_id: str
    version: int
    adapter_path: str
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    reused: bool
    retokenized: int
    token_mismatch_rate: float
    unknown_logprobs: int | None = None
    prompt_mismatch_rate: float | None = None
    kl: float | None = None
    clip_fraction: float | None = None
    mean_ratio: float | None = None
    ratio_tokens: int | None = None
    entropy: float | None = None
    denominator: float | None = None
    micro_batch: int | None = None


class DpoHyperparameters(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    learning_rate: Annotated[float, Field(gt=0.0)] = 1e-06
    beta: Annotated[float, Field(gt=0.0)] = 0.1
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 1


class DpoPair(DpoPairRules):
    model_config = ConfigDict(
        extra="forbid",
    )
    prompt: Prompt
    chosen: str
    rejected: str
    chosen_tokens_ref: Annotated[str | None, Field(pattern="^sha256:[0-9a-f]{64}\\.[a-z0-9]{1,8}$")] = None
    rejected_tokens_ref: Annotated[str | None, Field(pattern="^sha256:[0-9a-f]{64}\\.[a-z0-9]{1,8}$")] = None
    ref_chosen_logprob: float | None = None
    ref_rejected_logprob: float | None = None


class DpoBatch(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    pairs: Annotated[list[DpoPair], Field(min_length=1)]


class UpdateDpoInput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    run_id: Annotated[str, Field(min_length=1, pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")]
    version: Annotated[int, Field(ge=1)]
    batch_ref: str
    hyperparameters: Annotated[DpoHyperparameters, Field(validate_default=True)] = {}
    base_model: Annotated[str | None, Field(min_length=1)] = None


class UpdateDpoOutput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    run_id: str
    version: int
    adapter_path: str
    loss: float
    grad_norm: float
    tokens: int
    seconds: float
    reused: bool
    reward_margin: float
    accuracy: float


class SampleActionsInput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    run_id: Annotated[str, Field(min_length=1, pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")]
    version: Annotated[int, Field(ge=0)] = 0
    prompt_ref: str
    n: Annotated[int, Field(ge=1, le=64)] = 1
    temperature: Annotated[float, Field(ge=0.0)] = 0.7
    max_tokens: Annotated[int, Field(ge=1)] = 256
    seed: int | None = None
    explore: Annotated[float, Field(ge=0.0, le=1.0)] = 0
    base_model: Annotated[str | None, Field(min_length=1)] = None
    grammar_ref: str | None = None
    store_tokens: bool = False


class Completion(CompletionRules):
    model_config = ConfigDict(
        extra="forbid",
    )
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    tokens_ref: str | None = None
    logprob_sum: float | None = None
    finish_reason: Literal["stop", "length"]


class SampleActionsOutput(ContractModel):
    model_config = ConfigDict(
        extra="forbid",
    )
    completions: list[Completion]
    model: str
    version: int
    seconds: float
    batch_calls: Annotated[int, Field(ge=1)] = 1
