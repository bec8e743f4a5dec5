"""The update's step, as every data-parallel rank runs it (distributed.py): the leader through `Learner`, the others
through follower.py. One definition, so no rank can run the step with other arguments than the leader's."""

from __future__ import annotations

from .batches import dpo_samples, grpo_samples
from .dpo import dpo_step
from .grpo import grpo_step
from .memory import DpoPlan
from .payloads import DpoBatch, GrpoBatch, UpdateDpoInput, UpdatePolicyInput
from .prompts import PromptCache, completion_ids_from_text


class RankSteps:
    """Mixed into `Learner`: preparing a batch and running its step, and the leader's side of the messages."""

    def _announce(self, op: str, inp) -> None:
        """Leader: the other ranks join this update (distributed.py); their weights are unknown until it commits."""
        if self.ranks is not None:
            hold, self.followers_hold = self.followers_hold, None
            self.ranks.announce(op, inp.model_dump(mode="json"), hold)

    def _post_plan(self, plan) -> None:
        if self.ranks is not None:
            self.ranks.post_plan(plan)

    def prepare_grpo(self, batch: GrpoBatch, progress=None):
        # Encoding a large batch's screenshots takes seconds before the first chunk: heartbeat through it too.
        preparing = (lambda: progress({"phase": "update_policy", "stage": "prepare"})) if progress else None
        return grpo_samples(
            batch,
            PromptCache(self.policy.processor, self.blobs),
            self.policy.tokenizer,
            self._sampled_tokens,
            self._prompt_token_ids,
            lambda ref, ids: self.grammars.completion_bitmask(ref, ids),
            preparing,
            retokenise=completion_ids_from_text,
        )

    def grpo_update(self, inp: UpdatePolicyInput, batch: GrpoBatch, samples, micro_batch: int, beat=None):
        """The step itself, on every rank alike (follower.py runs it too)."""
        hp = inp.hyperparameters
        self.resident = None  # weights are about to change; unknown until committed
        self._set_lr(hp.learning_rate)
        return grpo_step(
            self.policy,
            self.optimizer,
            samples,
            clip_epsilon=hp.clip_epsilon,
            kl_coef=hp.kl_coef,
            temperature=hp.temperature,
            max_grad_norm=hp.max_grad_norm,
            max_completion_len=batch.max_completion_len,
            micro_batch=micro_batch,
            prefix_sharing=self.settings.prefix_sharing,
            on_progress=beat,
            weight_cap=hp.stale_weight_cap,
            ranks=self.ranks,
        )

    def prepare_dpo(self, batch: DpoBatch, progress=None):
        preparing = (lambda: progress({"phase": "update_dpo", "stage": "prepare"})) if progress else None
        return dpo_samples(
            batch,
            PromptCache(self.policy.processor, self.blobs),
            self.policy.tokenizer,
            self._sampled_tokens,
            lambda ref, ids: self.grammars.completion_bitmask(ref, ids),
            preparing,
        )

    def dpo_update(self, inp: UpdateDpoInput, samples, plan: DpoPlan, beat=None):
        """The step itself, on every rank alike (follower.py runs it too)."""
        hp = inp.hyperparameters
        self.resident = None
        self._set_lr(hp.learning_rate)
        return dpo_step(
            self.policy,
            self.optimizer,
            samples,
            beta=hp.beta,
            max_grad_norm=hp.max_grad_norm,
            packed=self.settings.prefix_sharing,
            plan=plan,
            on_progress=beat,
            ranks=self.ranks,
        )
