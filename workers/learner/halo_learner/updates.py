"""What differs between the learner's two updates, GRPO (update_policy) and step-level DPO (update_dpo).

`Learner._update` is the skeleton both share: the model check, a version already written, the batch, the parent
version, the plan under the memory budget, the step, the commit and the answer. Each algorithm here supplies its
parts, as the TypeScript descriptors do (workflows/algorithms/).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .payloads import DpoBatch, GrpoBatch, UpdateDpoOutput, UpdatePolicyOutput

if TYPE_CHECKING:
    from .learner import Learner

log = logging.getLogger("halo_learner")

GRPO_STAT_KEYS = ("kl", "clip_fraction", "mean_ratio", "ratio_tokens", "entropy", "denominator", "micro_batch")


class GrpoUpdate:
    op = "update_policy"
    kind = "grpo"
    batch = GrpoBatch
    output = UpdatePolicyOutput

    @staticmethod
    def reused(m: dict) -> dict:
        """The answer's own fields for a version already written, from its manifest's metrics."""
        return dict(
            retokenized=m.get("retokenized", 0),
            token_mismatch_rate=m.get("token_mismatch_rate", 0.0),
            unknown_logprobs=m.get("unknown_logprobs"),
            prompt_mismatch_rate=m.get("prompt_mismatch_rate"),
            **{k: m.get(k) for k in GRPO_STAT_KEYS},
        )

    @staticmethod
    def check(inp, batch: GrpoBatch) -> None:
        if batch.max_completion_len is None:
            log.warning(
                "batch %s has no max_completion_len: dr_grpo divides by B x its longest completion, which "
                "changes from batch to batch; write the run's policy.maxTokens into the batch",
                inp.batch_ref,
            )

    @staticmethod
    def prepare(learner: Learner, inp, batch: GrpoBatch, progress):
        prep = learner.prepare_grpo(batch, progress)
        return prep, learner._plan(inp.batch_ref, prep.samples)

    @staticmethod
    def posted(plan) -> Any:
        """The plan as the other data-parallel ranks receive it (distributed.py)."""
        return plan.micro_batch

    @staticmethod
    def chunk(plan) -> int:
        return plan.micro_batch

    @staticmethod
    def step(learner: Learner, inp, batch: GrpoBatch, prep, plan, beat):
        return learner.grpo_update(inp, batch, prep.samples, plan.micro_batch, beat)

    @staticmethod
    def report(inp, prep, plan, stats) -> tuple[dict, dict]:
        """The manifest's metrics (before the peak estimate and the hyperparameters) and the answer's own fields."""
        hp = inp.hyperparameters
        ratios, ts = stats.ratios, stats.token_stats
        update_stats = dict(
            kl=ts.kl,
            clip_fraction=ratios.clip_fraction if ratios.tokens else None,
            mean_ratio=ratios.mean_ratio,
            ratio_tokens=ratios.tokens,
            entropy=ts.entropy,
            denominator=stats.denominator,
            micro_batch=plan.micro_batch,
        )
        metrics = dict(
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            tokens=stats.tokens,
            seconds=stats.seconds,
            items=len(prep.samples),
            retokenized=prep.retokenized,
            token_mismatch_rate=prep.token_mismatch_rate,
            unknown_logprobs=prep.unknown_logprobs,
            prompt_mismatch_rate=prep.prompt_mismatch_rate,
            prompts_dropped=prep.prompts_dropped,
            max_abs_log_ratio=ratios.max_abs_log_ratio,
            mean_abs_log_ratio=ratios.mean_abs_log_ratio,
            capped_fraction=ratios.capped_fraction if hp.stale_weight_cap is not None and ratios.tokens else None,
            **update_stats,
        )
        answer = dict(
            retokenized=prep.retokenized,
            token_mismatch_rate=prep.token_mismatch_rate,
            unknown_logprobs=prep.unknown_logprobs,
            prompt_mismatch_rate=prep.prompt_mismatch_rate,
            **update_stats,
        )
        return metrics, answer

    @staticmethod
    def log_done(inp, prep, plan, stats) -> None:
        hp = inp.hyperparameters
        ratios, ts = stats.ratios, stats.token_stats
        log.info(
            "update_policy %s v%d: loss %.5f grad_norm %.4f tokens %d kl %s entropy %.3f (%d retokenised items, "
            "%d tokens with sampler log-probs, %d unknown, %.3f clipped, mean |log-ratio| to the sampler %.4f, "
            "%s objective, micro-batch %d) in %.2fs",
            inp.run_id,
            inp.version,
            stats.loss,
            stats.grad_norm,
            stats.tokens,
            ts.kl,
            ts.entropy or 0.0,
            prep.retokenized,
            ratios.tokens,
            prep.unknown_logprobs,
            ratios.clip_fraction,
            ratios.mean_abs_log_ratio or 0.0,
            "plain" if hp.stale_weight_cap is None else f"decoupled (cap {hp.stale_weight_cap:g})",
            plan.micro_batch,
            stats.seconds,
        )


class DpoUpdate:
    op = "update_dpo"
    kind = "dpo"
    batch = DpoBatch
    output = UpdateDpoOutput

    @staticmethod
    def reused(m: dict) -> dict:
        return dict(reward_margin=m.get("reward_margin", 0.0), accuracy=m.get("accuracy", 0.0))

    @staticmethod
    def check(inp, batch: DpoBatch) -> None:
        pass

    @staticmethod
    def prepare(learner: Learner, inp, batch: DpoBatch, progress):
        prep = learner.prepare_dpo(batch, progress)
        return prep, learner._plan_dpo(inp.batch_ref, prep.samples)

    @staticmethod
    def posted(plan) -> Any:
        return plan.to_json()

    @staticmethod
    def chunk(plan) -> int:
        return plan.pairs_per_chunk

    @staticmethod
    def step(learner: Learner, inp, batch: DpoBatch, prep, plan, beat):
        return learner.dpo_update(inp, prep.samples, plan, beat)

    @staticmethod
    def report(inp, prep, plan, stats) -> tuple[dict, dict]:
        if stats.logged_refs_ignored:
            log.info(
                "update_dpo %s v%d: %d pairs carried logged reference log-probs; the reference is the base "
                "model for every pair, so they were not used",
                inp.run_id,
                inp.version,
                stats.logged_refs_ignored,
            )
        metrics = dict(
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            tokens=stats.tokens,
            seconds=stats.seconds,
            pairs=len(prep.samples),
            reward_margin=stats.reward_margin,
            accuracy=stats.accuracy,
            chosen_logp=stats.chosen_logp,
            rejected_logp=stats.rejected_logp,
            retokenized=prep.retokenized,
            token_mismatch_rate=(prep.mismatched / prep.retokenized) if prep.retokenized else 0.0,
            constrained=prep.constrained,
            pairs_per_chunk=plan.pairs_per_chunk,
            chunks=stats.chunks,
            checkpointed_chunks=stats.checkpointed_chunks,
        )
        return metrics, dict(reward_margin=stats.reward_margin, accuracy=stats.accuracy)

    @staticmethod
    def log_done(inp, prep, plan, stats) -> None:
        log.info(
            "update_dpo %s v%d: loss %.5f margin %.4f accuracy %.2f (%d retokenised and %d grammar-masked "
            "completions, %d chunks of up to %d pairs, %d checkpointed) in %.2fs",
            inp.run_id,
            inp.version,
            stats.loss,
            stats.reward_margin,
            stats.accuracy,
            prep.retokenized,
            prep.constrained,
            stats.chunks,
            plan.pairs_per_chunk,
            stats.checkpointed_chunks,
            stats.seconds,
        )
