"""Temporal activities of the `gpu` task queue. Each takes one snake_case JSON object and returns one.

Error classification (Temporal does the retrying; nothing here retries on its own):
  bad payload / bad batch / missing blob / missing parent adapter  -> non-retryable ApplicationError
  version on disk from another batch, or another base model         -> non-retryable (StaleVersion, ModelMismatch)
  attention implementation that ignores the packed block mask       -> non-retryable (UnsupportedAttention)
  out of GPU memory                                                -> retryable, the retry runs half the chunk
                                                                      size; non-retryable once one row fails
  a prompt whose text would change its structure                   -> non-retryable (InvalidPrompt)
  anything else, BaseException included (cancellation aside)       -> ApplicationError of the exception's type
                                                                      with its last frame; StopIteration is
                                                                      non-retryable, the rest retryable

No exception may leave an activity as itself: a StopIteration raised in the executor thread cannot be put into
an asyncio future, so the attempt would never complete and its slot would stay taken forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import traceback

import torch
from pydantic import BaseModel, ValidationError
from temporalio import activity
import temporalio.exceptions
from temporalio.exceptions import ApplicationError

from .adapters import AdapterDamaged, ModelMismatch, ParentVersionMissing, StaleVersion
from .blobs import BadBlobRef, BlobNotFound
from .inflight import InflightLedger
from .learner import InvalidBatch, Learner
from .logprobs import UnsupportedAttention
from .payloads import SampleActionsInput, SampleActionsOutput, UpdateDpoInput, UpdatePolicyInput
from .prompt_text import PromptStructureError
from .sample_batcher import Batching, SampleBatcher, wait_step

# Cancellation, and the SDK's own signal for asynchronous completion, must reach the SDK as they are.
_PASS_THROUGH = (asyncio.CancelledError, temporalio.exceptions.CancelledError, activity._CompleteAsyncError)
# Exceptions that a retry of the same input raises again.
_DETERMINISTIC = (StopIteration, StopAsyncIteration, RecursionError)


def _describe(err: ValidationError, what: str) -> str:
    parts = []
    for e in err.errors()[:5]:
        field = ".".join(str(x) for x in e["loc"]) or "(root)"
        parts.append(f"{field}: {e['msg']}")
    return f"invalid {what}: " + "; ".join(parts)


def last_frame(err: BaseException) -> str:
    """`file:line in function` of the frame that raised `err` (the deepest one of its traceback)."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return "no traceback"
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}"


def as_application_error(name: str, err: BaseException) -> ApplicationError:
    """Any exception the classification above does not know, as an ApplicationError the SDK can report."""
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return ApplicationError(
        f"{name}: {what} (at {last_frame(err)})", type=type(err).__name__, non_retryable=isinstance(err, _DETERMINISTIC)
    )


def _deadline() -> float | None:
    """When the running activity's own timeout ends (time.monotonic()); None outside an activity or without one."""
    if not activity.in_activity():
        return None
    info = activity.info()
    limit = info.start_to_close_timeout or info.schedule_to_close_timeout
    return time.monotonic() + limit.total_seconds() if limit else None


def _heartbeat(details: dict) -> None:
    if activity.in_activity():
        activity.heartbeat(details)


class LearnerActivities:
    def __init__(self, learner: Learner, ledger: InflightLedger | None = None, batching: Batching | None = None):
        self.learner = learner
        self.ledger = ledger
        # The GPU: an update holds it alone; sampling calls hold it together, as one batch (sample_batcher.py).
        self._gpu = threading.Lock()
        self.batcher = SampleBatcher(self._sample_batch, self._gpu, batching or Batching.from_env())

    @property
    def slots(self) -> int:
        """Activities the worker takes at once: as many as one sampling batch may hold."""
        return self.batcher.batching.calls

    def _sample_batch(self, inps: list[SampleActionsInput]) -> list:
        return self.learner.sample_many(inps)

    def _sample(self, inp: SampleActionsInput, beat) -> SampleActionsOutput:
        out, calls = self.batcher.submit(inp, inp.n, beat, _deadline())
        return out.model_copy(update={"batch_calls": calls})

    @contextlib.contextmanager
    def _held(self, exclusive: bool):
        """The GPU to this call alone (an update), heartbeating while a batch or another update has it; a call
        that waits past its own timeout gives up (Temporal has timed it out) before the watchdog would step in."""
        if not exclusive:
            yield
            return
        deadline = _deadline()
        while not self._gpu.acquire(timeout=wait_step(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("the update waited for the GPU past its own timeout")
            _heartbeat({"phase": "waiting for the GPU"})
        try:
            yield
        finally:
            self._gpu.release()

    def _run(self, name: str, model: type[BaseModel], raw: dict, fn, exclusive: bool = True) -> dict:
        try:
            return self._classified(name, model, raw, fn, exclusive)
        except (ApplicationError, *_PASS_THROUGH):
            raise
        except BaseException as e:  # noqa: BLE001 - see the module's docstring: nothing leaves as itself
            raise as_application_error(name, e) from None

    def _classified(self, name: str, model: type[BaseModel], raw: dict, fn, exclusive: bool) -> dict:
        try:
            inp = model.model_validate(raw)
        except ValidationError as e:
            raise ApplicationError(_describe(e, f"{name} input"), type="InvalidPayload", non_retryable=True) from None
        tracked = self.ledger is not None and activity.in_activity()
        try:
            entry = self.ledger.begin(activity.info()) if tracked else None
            try:
                with self._held(exclusive):
                    if exclusive:
                        self.learner.planned = None
                    try:
                        return fn(inp, _heartbeat).model_dump()
                    except torch.OutOfMemoryError as e:
                        # Still holding the GPU: the update's bookkeeping cannot meet another's.
                        raise self._out_of_memory(name, e, exclusive) from None
            finally:
                if entry is not None:
                    self.ledger.end(entry)
        except ValidationError as e:
            raise ApplicationError(
                _describe(e, f"{name} blob contents"), type="InvalidBatch", non_retryable=True
            ) from None
        except PromptStructureError as e:
            raise ApplicationError(f"{name}: {e}", type="InvalidPrompt", non_retryable=True) from None
        except (InvalidBatch, BadBlobRef) as e:
            raise ApplicationError(f"{name}: {e}", type="InvalidBatch", non_retryable=True) from None
        except BlobNotFound as e:
            raise ApplicationError(f"{name}: {e}", e.ref, type="BlobNotFound", non_retryable=True) from None
        except AdapterDamaged as e:
            raise ApplicationError(f"{name}: {e}", type="AdapterDamaged", non_retryable=True) from None
        except ParentVersionMissing as e:
            raise ApplicationError(
                f"{name}: {e}; versions must be applied in order", type="ParentVersionMissing", non_retryable=True
            ) from None
        except StaleVersion as e:
            raise ApplicationError(f"{name}: {e}", type="StaleVersion", non_retryable=True) from None
        except ModelMismatch as e:
            raise ApplicationError(f"{name}: {e}", type="ModelMismatch", non_retryable=True) from None
        except UnsupportedAttention as e:
            raise ApplicationError(f"{name}: {e}", type="UnsupportedAttention", non_retryable=True) from None
        except FloatingPointError as e:
            # The same batch gives the same non-finite gradient on every attempt: retrying cannot help.
            raise ApplicationError(
                f"{name}: {e}; lower the learning rate or check the batch", type="NonFiniteGradient", non_retryable=True
            ) from None

    def _out_of_memory(self, name: str, e: torch.OutOfMemoryError, exclusive: bool) -> ApplicationError:
        first = str(e).splitlines()[0] if str(e) else "out of memory"
        if not exclusive:
            # The batch already gave its memory back (Learner.sample_many).
            return ApplicationError(
                f"{name}: out of GPU memory while sampling ({first}); the retry samples again "
                "(HALO_SAMPLE_BATCH_ROWS bounds the completions sampled at once)",
                type="OutOfMemory",
                non_retryable=False,
            )
        self.learner.resident = None
        failed_at = self.learner.planned[1] if self.learner.planned else None
        nxt = self.learner.after_oom()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if failed_at is not None and nxt is None:
            return ApplicationError(
                f"{name}: out of GPU memory with one completion (DPO: one pair) per chunk ({first}); lower policy.maxTokens, "
                "give the learner more memory (HALO_LEARNER_MEMORY_GB, vLLM's --gpu-memory-utilization) or a GPU "
                "of its own",
                type="OutOfMemory",
                non_retryable=True,
            )
        if nxt is not None:
            _heartbeat({"phase": name, "oom_at_micro_batch": failed_at, "next_micro_batch": nxt})
        return ApplicationError(
            f"{name}: out of GPU memory ({first}); the retry runs "
            f"{'micro-batch ' + str(nxt) if nxt else 'the same batch again'}",
            type="OutOfMemory",
            non_retryable=False,
        )

    @activity.defn(name="update_policy")
    def update_policy(self, raw: dict) -> dict:
        return self._run("update_policy", UpdatePolicyInput, raw, self.learner.update_policy)

    @activity.defn(name="update_dpo")
    def update_dpo(self, raw: dict) -> dict:
        return self._run("update_dpo", UpdateDpoInput, raw, self.learner.update_dpo)

    @activity.defn(name="sample_actions")
    def sample_actions(self, raw: dict) -> dict:
        return self._run("sample_actions", SampleActionsInput, raw, self._sample, exclusive=False)

    def all(self) -> list:
        return [self.update_policy, self.update_dpo, self.sample_actions]
