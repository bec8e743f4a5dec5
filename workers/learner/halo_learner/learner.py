"""The resident learner: one model, one LoRA adapter whose (run_id, version) is tracked, and the three
operations the Temporal activities expose. No Temporal imports here, so tests drive it directly.

Version bookkeeping: v<N>'s parent is v<N-1>; v0 is the seeded LoRA init. Before an update the resident
adapter is brought to v<N-1> (from disk if needed); while the update runs it is marked unknown, so a
failed or interrupted update can never leak half-applied weights into the next one. An existing v<N> is
returned only to a retry of the same batch on the same base model (adapters.check_existing).

Memory: the chunk size of an update is planned from the batch's shape under the memory budget
(memory.py); after an out-of-memory failure the retry of that batch runs with half the chunk size.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from pydantic import TypeAdapter, ValidationError

from . import adapters, retention
from .adapters import check_model
from .batches import InvalidBatch
from .blobs import BlobStore
from .dpo import DpoSample, plan_chunks
from .grammar import Grammars
from .grpo import GrpoSample
from .logprobs import check_block_mask_attention, compile_packed_layers
from .distributed import Ranks
from .steps import RankSteps
from .updates import DpoUpdate, GrpoUpdate
from .memory import DpoPlan, MemoryModel, OomHints, Plan, budget_bytes, plan_micro_batch
from .models import Policy, load_policy
from .payloads import (
    SampleActionsInput,
    SampleActionsOutput,
    SampledTokens,
    UpdateDpoInput,
    UpdateDpoOutput,
    UpdatePolicyInput,
    UpdatePolicyOutput,
    Completion,
    Prompt,
    PromptTokenIds,
)
from .prompts import encode_prompt
from .sampling import SampleRequest, Sampled, sample_batch, stop_ids

log = logging.getLogger("halo_learner")
Progress = Callable[[dict], None]
PROMPT_ADAPTER = TypeAdapter(Prompt)


@dataclass
class Settings:
    micro_batch: int = 8
    prefix_sharing: bool = True  # packed GRPO and DPO passes (HALO_PREFIX_SHARING=0: the padded baselines)
    dpo_pairs_per_chunk: int = 8  # at most, per gradient chunk; the memory plan may choose fewer
    compile: bool = False  # torch.compile the decoder layers for the packed GRPO and DPO passes (HALO_COMPILE=1)
    keep_last: int = retention.DEFAULT_KEEP_LAST  # versions kept with optimiser state (HALO_KEEP_VERSIONS)

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            micro_batch=int(os.environ.get("HALO_MICRO_BATCH", 8)),
            prefix_sharing=os.environ.get("HALO_PREFIX_SHARING", "1") not in ("0", "false", "no"),
            dpo_pairs_per_chunk=int(os.environ.get("HALO_DPO_PAIRS_PER_CHUNK", 8)),
            compile=os.environ.get("HALO_COMPILE", "0") in ("1", "true", "yes"),
            keep_last=retention.keep_last_from_env(),
        )


class Learner(RankSteps):
    def __init__(
        self,
        policy: Policy,
        blobs: BlobStore | None = None,
        checkpoints: Path | None = None,
        settings: Settings | None = None,
        oom_hints: OomHints | None = None,
        ranks: Ranks | None = None,
    ):
        self.policy = policy
        # Data-parallel (distributed.py): this learner leads when rank 0, and follows through follower.py otherwise.
        self.ranks = ranks
        self.followers_hold: tuple[str, int] | None = None  # the version every other rank holds in memory
        self.blobs = blobs or BlobStore()
        self.checkpoints = checkpoints
        self.settings = settings or Settings.from_env()
        if self.settings.prefix_sharing:
            check_block_mask_attention(policy)  # refuse at load, not at the first update
        self.oom_hints = oom_hints or OomHints()
        self.planned: tuple[str, int] | None = None  # (batch_ref, chunk size) of the update in progress
        if self.settings.compile and self.settings.prefix_sharing:
            compile_packed_layers(policy)
        params = list(policy.trainable_parameters().values())
        # No weight decay: it would pull the adapter towards 0 (the base policy) between RL steps.
        self.optimizer = torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self.resident: tuple[str, int] | None = None
        self.optimizer_synced = False  # AdamW moments belong to `resident`
        self._grammars: Grammars | None = None

    @property
    def grammars(self) -> Grammars:
        """xgrammar compiler for this model's tokenizer, built on first use (unconstrained runs never need it)."""
        if self._grammars is None:
            lm_head = self.policy.model.get_output_embeddings()
            vocab = lm_head.out_features if lm_head is not None else len(self.policy.tokenizer)
            self._grammars = Grammars(self.policy.tokenizer, vocab, sorted(stop_ids(self.policy.tokenizer)), self.blobs)
        return self._grammars

    @classmethod
    def from_env(cls) -> "Learner":
        return cls(load_policy())

    # ---- version bookkeeping ---------------------------------------------------------------------

    def _vdir(self, run_id: str, version: int) -> Path:
        # With an object store (HALO_STORE) the local folder is a cache, fetched or published here.
        return adapters.synced_version_dir(run_id, version, self.checkpoints)

    def _ensure(self, run_id: str, version: int, with_optimizer: bool) -> None:
        """Make the resident adapter v<version> of run_id."""
        if self.resident == (run_id, version) and (self.optimizer_synced or not with_optimizer):
            return
        if version == 0:
            adapters.reset_to_initial(self.policy, self.optimizer)
        elif self.resident == (run_id, version):
            adapters.load_optimizer(self.policy, self.optimizer, self._vdir(run_id, version))
        else:
            self.resident = None
            if not self._vdir(run_id, version).exists():
                raise adapters.ParentVersionMissing(
                    f"adapter {run_id}/v{version} does not exist under {self._vdir(run_id, version).parent}"
                )
            adapters.load_version(self.policy, self.optimizer, run_id, version, self.checkpoints, with_optimizer)
        self.resident = (run_id, version)
        self.optimizer_synced = with_optimizer or version == 0

    def _reused(self, path: Path) -> dict:
        m = adapters.read_manifest(path)["metrics"]
        return dict(
            adapter_path=str(path),
            loss=m.get("loss", 0.0),
            grad_norm=m.get("grad_norm", 0.0),
            tokens=m.get("tokens", 0),
            seconds=0.0,
            reused=True,
        )

    def _set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def _commit(self, run_id: str, version: int, kind: str, metrics: dict, batch_ref: str) -> tuple[Path, bool]:
        path, reused = adapters.save_version(
            self.policy,
            self.optimizer,
            run_id,
            version,
            version - 1,
            kind,
            metrics,
            self.checkpoints,
            batch_ref=batch_ref,
        )
        self.resident = (run_id, version) if not reused else None
        self.optimizer_synced = not reused
        if self.ranks is not None and not reused:
            self.followers_hold = (run_id, version)
        self.planned = None
        try:
            retention.prune_after_update(self.checkpoints, run_id, self.settings.keep_last)
        except (OSError, ValueError, KeyError, TypeError) as e:  # housekeeping never fails a committed update
            log.warning("pruning optimiser state of %s failed: %s: %s", run_id, e.__class__.__name__, e)
        return path, reused

    def _existing(self, run_id: str, version: int, batch_ref: str) -> dict | None:
        # A damaged folder of the version asked for is not an answer: it goes aside and the update writes it again.
        adapters.quarantine_if_damaged(run_id, version, self.checkpoints)
        path = self._vdir(run_id, version)
        if not path.exists():
            return None
        return adapters.check_existing(path, run_id, version, batch_ref, self.policy.model_id)["metrics"]

    def _cap(self, batch_ref: str, configured: int) -> int:
        hint = self.oom_hints.cap(batch_ref)
        return min(configured, hint) if hint else configured

    def after_oom(self) -> int | None:
        """Record an out-of-memory failure of the update in progress; the next chunk size, None if none is left."""
        if self.planned is None:
            return None
        batch_ref, k = self.planned
        self.planned = None
        return self.oom_hints.shrink(batch_ref, k)

    def _plan(self, batch_ref: str, samples: list[GrpoSample]) -> Plan:
        packed = self.settings.prefix_sharing
        if packed:
            groups: dict[str, tuple[int, list[int]]] = {}
            for s in samples:
                groups.setdefault(s.prompt_key, (len(s.prompt), []))[1].append(len(s.ids))
            shape = list(groups.values())
        else:
            shape = [(len(s.prompt), [len(s.ids)]) for s in samples]
        plan = plan_micro_batch(
            shape,
            self._cap(batch_ref, self.settings.micro_batch),
            budget_bytes(self.policy.device),
            MemoryModel.from_policy(self.policy, packed),
            packed,
        )
        if not plan.fits:
            log.warning(
                "batch %s: even one completion per chunk is estimated at %.1f GiB, over the %.1f GiB budget "
                "(HALO_LEARNER_MEMORY_GB); trying anyway",
                batch_ref,
                plan.peak_bytes / 2**30,
                (plan.budget_bytes or 0) / 2**30,
            )
        self.planned = (batch_ref, plan.micro_batch)
        return plan

    def _plan_dpo(self, batch_ref: str, samples: list[DpoSample]) -> DpoPlan:
        plan = plan_chunks(
            self.policy,
            samples,
            self._cap(batch_ref, self.settings.dpo_pairs_per_chunk),
            self.settings.prefix_sharing,
            budget_bytes(self.policy.device),
        )
        if not plan.fits:
            log.warning(
                "batch %s: one DPO pair per chunk is estimated at %.1f GiB, over the %.1f GiB budget "
                "(HALO_LEARNER_MEMORY_GB); trying anyway",
                batch_ref,
                plan.peak_bytes / 2**30,
                (plan.budget_bytes or 0) / 2**30,
            )
        self.planned = (batch_ref, plan.pairs_per_chunk)
        return plan

    # ---- update_policy and update_dpo: one skeleton, each algorithm's parts in updates.py ---------------

    def update_policy(self, inp: UpdatePolicyInput, progress: Progress | None = None) -> UpdatePolicyOutput:
        return self._update(GrpoUpdate, inp, progress)

    def update_dpo(self, inp: UpdateDpoInput, progress: Progress | None = None) -> UpdateDpoOutput:
        return self._update(DpoUpdate, inp, progress)

    def _update(self, algo: type[GrpoUpdate] | type[DpoUpdate], inp, progress: Progress | None):
        check_model(inp.base_model, self.policy.model_id, f"{algo.op} {inp.run_id}/v{inp.version}")
        m = self._existing(inp.run_id, inp.version, inp.batch_ref)
        if m is not None:
            reused = self._reused(self._vdir(inp.run_id, inp.version))
            return algo.output(run_id=inp.run_id, version=inp.version, **reused, **algo.reused(m))
        batch = algo.batch.model_validate(self.blobs.get_json(inp.batch_ref))
        algo.check(inp, batch)
        self._announce(algo.op, inp)
        try:
            self._ensure(inp.run_id, inp.version - 1, with_optimizer=True)
            prep, plan = algo.prepare(self, inp, batch, progress)
        except BaseException:
            self._post_plan(None)
            raise
        self._post_plan(algo.posted(plan))
        beat = _beater(progress, algo.op, len(prep.samples), micro_batch=algo.chunk(plan))
        stats = algo.step(self, inp, batch, prep, plan, beat)
        metrics, answer = algo.report(inp, prep, plan, stats)
        metrics.update(estimated_peak_gib=plan.peak_bytes / 2**30, hyperparameters=inp.hyperparameters.model_dump())
        path, reused = self._commit(inp.run_id, inp.version, algo.kind, metrics, inp.batch_ref)
        if reused:  # another learner wrote this version meanwhile; its weights are the truth
            return self._update(algo, inp, progress)
        algo.log_done(inp, prep, plan, stats)
        return _fresh_output(algo.output, inp, path, stats, **answer)

    def _sampled_tokens(self, ref: str, where: str) -> SampledTokens:
        """The sampler's tokens behind a reference, checked (ids non-empty, one log-prob per id); a missing blob is
        BlobNotFound, one that breaks the schema an InvalidBatch naming the item."""
        return self._checked_blob(SampledTokens, ref, where, "the sampler's tokens")

    def _prompt_token_ids(self, ref: str, where: str) -> list[int]:
        return self._checked_blob(PromptTokenIds, ref, where, "the server's prompt ids").prompt_token_ids

    def _checked_blob(self, model, ref: str, where: str, what: str):
        raw = self.blobs.get(ref)
        try:
            return model.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            field = ".".join(str(x) for x in first["loc"]) or "(root)"
            raise InvalidBatch(f"{where}: {ref} is not {what}: {field}: {first['msg']}") from None

    # ---- sample_actions --------------------------------------------------------------------------

    def sample_actions(self, inp: SampleActionsInput, progress: Progress | None = None) -> SampleActionsOutput:
        """One call alone (the batcher's calls come through `sample_many`)."""
        out = self.sample_many([inp])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def sample_many(self, inps: list[SampleActionsInput]) -> list[SampleActionsOutput | Exception]:
        """Calls that arrived together, sampled as one batch per adapter version (sampling.py `sample_batch`);
        each call gets its own answer, or the exception that stopped it (a bad prompt stops that call only)."""
        t0 = time.monotonic()
        out: list[SampleActionsOutput | Exception | None] = [None] * len(inps)
        groups: dict[tuple[str | None, int], list[tuple[int, SampleRequest]]] = {}
        for i, inp in enumerate(inps):
            try:
                check_model(inp.base_model, self.policy.model_id, f"sample_actions for {inp.run_id}")
                msgs = PROMPT_ADAPTER.validate_python(self.blobs.get_json(inp.prompt_ref))
                prompt = encode_prompt(self.policy.processor, msgs, self.blobs)
                req = SampleRequest(
                    prompt, inp.n, inp.temperature, inp.max_tokens, inp.seed, inp.grammar_ref, inp.explore
                )
                key = (None, 0) if inp.version == 0 else (inp.run_id, inp.version)
                groups.setdefault(key, []).append((i, req))
            except Exception as e:  # noqa: BLE001 - this call's own error (classified by the activity)
                out[i] = e
        for (run_id, version), group in groups.items():
            reqs = [r for _, r in group]
            try:
                if version == 0:
                    with self.policy.model.disable_adapter():
                        sampled = sample_batch(self.policy, reqs, self.grammars)
                else:
                    self._ensure(run_id, version, with_optimizer=False)
                    sampled = sample_batch(self.policy, reqs, self.grammars)
            except Exception as e:  # noqa: BLE001 - every call of the group
                if isinstance(e, torch.OutOfMemoryError):
                    self.resident = None
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                for i, _ in group:
                    out[i] = e
                continue
            for (i, _), completions in zip(group, sampled):
                try:
                    out[i] = self._sample_output(inps[i], completions, time.monotonic() - t0)
                except Exception as e:  # noqa: BLE001
                    out[i] = e
        return out

    def _sample_output(self, inp: SampleActionsInput, sampled: list[Sampled], seconds: float) -> SampleActionsOutput:
        def tokens(s) -> dict:
            if not inp.store_tokens:
                return dict(token_ids=s.token_ids, logprobs=s.logprobs)
            # The same blob shape as the openai path's (SampledTokens, lib/training/experience.ts), and the grammar with it,
            # so one blob says everything the learner needs to rescore the completion.
            blob = SampledTokens(token_ids=s.token_ids, logprobs=s.logprobs, grammar_ref=inp.grammar_ref)
            return dict(tokens_ref=self.blobs.put_json(blob.model_dump()))

        return SampleActionsOutput(
            completions=[
                Completion(text=s.text, finish_reason=s.finish_reason, logprob_sum=math.fsum(s.logprobs), **tokens(s))
                for s in sampled
            ],
            model=self.policy.model_id,
            version=inp.version,
            seconds=seconds,
        )


def _beater(progress: Progress | None, phase: str, items: int, **extra) -> Callable[[], None]:
    count = [0]

    def beat() -> None:
        count[0] += 1
        if progress:
            progress({"phase": phase, "steps": count[0], "items": items, **extra})

    return beat


def _fresh_output(cls, inp, path, stats, **extra):
    """An update's answer for a version this call wrote (not reused), whichever algorithm wrote it."""
    return cls(
        run_id=inp.run_id,
        version=inp.version,
        adapter_path=str(path),
        loss=stats.loss,
        grad_norm=stats.grad_norm,
        tokens=stats.tokens,
        seconds=stats.seconds,
        reused=False,
        **extra,
    )
