"""A data-parallel learner rank other than 0: no Temporal worker, it takes the leader's commands (distributed.py)
and runs its shard of each update with the same step as the leader (steps.py), then waits for the next.

Its adapter and optimiser state stay equal to the leader's: the same parent version (from memory when the leader
says the followers hold it, else from the version the leader wrote), the same summed gradients, the same step.
It writes nothing: the leader writes every version.
"""

from __future__ import annotations

import logging

import torch

from .batches import InvalidBatch
from .distributed import RankFailed
from .learner import Learner
from .memory import DpoPlan
from .payloads import DpoBatch, GrpoBatch, UpdateDpoInput, UpdatePolicyInput

log = logging.getLogger("halo_learner.follower")

_INPUTS = {"update_policy": UpdatePolicyInput, "update_dpo": UpdateDpoInput}


def run_command(learner: Learner, cmd: dict) -> None:
    """One update, this rank's part; raises what made it fail (on every rank alike, through `settle`)."""
    ranks = learner.ranks
    op = cmd["op"]
    if op not in _INPUTS:
        raise InvalidBatch(f"unknown learner command {op!r}")
    hold = tuple(cmd["hold"]) if cmd["hold"] else None
    if learner.resident != hold:
        learner.resident = None  # what this rank holds is not what the leader wrote: read the version instead
    inp = _INPUTS[op].model_validate(cmd["input"])
    error, batch, prep = None, None, None
    try:
        learner._ensure(inp.run_id, inp.version - 1, with_optimizer=True)
        if op == "update_policy":
            batch = GrpoBatch.model_validate(learner.blobs.get_json(inp.batch_ref))
            prep = learner.prepare_grpo(batch)
        else:
            batch = DpoBatch.model_validate(learner.blobs.get_json(inp.batch_ref))
            prep = learner.prepare_dpo(batch)
    except Exception as e:  # noqa: BLE001 - reported to every rank at settle time
        error = e
    plan = ranks.plan()
    if plan is None:  # the leader gave up before planning: no rank runs this update
        return
    learner.resident = None
    if error is not None:
        ranks.settle(error, "")
    if op == "update_policy":
        learner.grpo_update(inp, batch, prep.samples, int(plan))
    else:
        learner.dpo_update(inp, prep.samples, DpoPlan.from_json(plan))
    learner.resident = (inp.run_id, inp.version)
    learner.optimizer_synced = True


def follow(learner: Learner) -> None:
    """Commands until the leader says stop (or its store goes away, which raises)."""
    ranks = learner.ranks
    log.info("learner rank %d of %d following", ranks.rank, ranks.world)
    while True:
        cmd = ranks.next_command()
        if cmd["op"] == "stop":
            ranks.done()
            return
        try:
            run_command(learner, cmd)
        except (RankFailed, Exception) as e:  # noqa: BLE001 - the leader reports the update's failure
            log.warning("rank %d: %s %s failed here: %s", ranks.rank, cmd["op"], cmd["input"].get("version"), e)
            learner.resident = None
            if isinstance(e, torch.OutOfMemoryError) and torch.cuda.is_available():
                torch.cuda.empty_cache()
        finally:
            ranks.done()
