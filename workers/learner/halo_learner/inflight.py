"""The running activity's task token, on disk, so a restarted learner can fail its predecessor's attempt at once.

When the learner dies mid-activity (SIGKILL, preemption, OOM killer), Temporal only notices when the
heartbeat timeout runs out (60 s by default, longer for big models), and the retry cannot start before that.
The learner owns the `gpu` queue of its machine, so its successor knows better: at startup it reads the
ledger its predecessor left and fails that attempt through the task token (RespondActivityTaskFailed). The
retry policy then schedules the next attempt right away, on the new process. Idempotency per (run_id,
version) keeps a half-done update from being applied twice, as for any retry.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

log = logging.getLogger("halo_learner.inflight")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process: not ours to judge
    return True


class InflightLedger:
    """One JSON file per task queue: written when an activity starts, removed when it ends."""

    def __init__(self, path: Path):
        self.path = path

    def begin(self, info: activity.Info) -> None:
        record = {
            "pid": os.getpid(),
            "task_token": base64.b64encode(info.task_token).decode("ascii"),
            "activity_type": info.activity_type,
            "activity_id": info.activity_id,
            "workflow_id": info.workflow_id,
            "attempt": info.attempt,
            "started": time.time(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)

    def end(self) -> None:
        self.path.unlink(missing_ok=True)

    def orphan(self) -> dict | None:
        """The predecessor's unfinished attempt, or None (no ledger, unreadable, or its process still runs)."""
        try:
            record = json.loads(self.path.read_text())
            pid = int(record["pid"])
            base64.b64decode(record["task_token"], validate=True)
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            log.warning("ignoring an unreadable in-flight ledger %s: %s", self.path, e)
            self.end()
            return None
        # Same pid as ours: a reused pid (e.g. a restarted container), so the writer is gone.
        if pid != os.getpid() and _alive(pid):
            log.warning("in-flight ledger %s belongs to the running process %d: left alone", self.path, pid)
            return None
        return record


async def release_orphan(client: Client, ledger: InflightLedger) -> str | None:
    """Fails the attempt a dead predecessor left running; returns a line saying what happened, or None."""
    record = ledger.orphan()
    if record is None:
        return None
    what = f"{record.get('activity_type')} of {record.get('workflow_id')} (attempt {record.get('attempt')})"
    handle = client.get_async_activity_handle(task_token=base64.b64decode(record["task_token"]))
    try:
        await handle.fail(ApplicationError(
            f"the learner process {record['pid']} died during this attempt; its successor failed it so that the "
            "retry starts now instead of after the heartbeat timeout", type="LearnerRestarted"))
        line = f"failed the attempt a dead learner left running: {what}; Temporal retries it now"
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        # Timed out, completed or cancelled meanwhile: nothing to release.
        line = f"the attempt a dead learner left running is already over: {what}"
    ledger.end()
    return line
