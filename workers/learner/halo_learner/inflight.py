"""The running activity's task token, on disk, so a restarted learner can fail its predecessor's attempt at once.

When the learner dies mid-activity (SIGKILL, preemption, OOM killer), Temporal only notices when the
heartbeat timeout runs out (60 s by default, longer for big models), and the retry cannot start before that.
The learner owns the `gpu` queue of its machine, so its successor knows better: at startup it reads the
ledger its predecessor left and fails that attempt through the task token (RespondActivityTaskFailed). The
retry policy then schedules the next attempt right away, on the new process. Idempotency per (run_id,
version) keeps a half-done update from being applied twice, as for any retry.

A ledger is one file per attempt in flight, `inflight-<queue>-<host>-<pid>[-<n>].json` (mode 0600 in a 0700
folder: a task token completes the activity), like the TypeScript workers' (workers/inflight.ts): sampling calls
run several at once (sample_batcher.py), an update one at a time. A learner only takes over
ledgers of its own queue and host whose process is gone, so learners of one queue on several hosts sharing
a home leave each other's attempts alone.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import socket
import threading
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


def _write_private(path: Path, text: str) -> None:
    """Writes `text` to a new file readable by its owner only, then moves it to `path`."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    os.replace(tmp, path)


class InflightLedger:
    """One JSON file per attempt of this learner process: written when an activity starts, removed when it ends."""

    def __init__(self, directory: Path, queue: str, host: str | None = None):
        self.directory = directory
        self.queue = queue
        self.host = host or socket.gethostname()
        self.prefix = f"inflight-{queue}-{self.host}-"
        self.path = directory / f"{self.prefix}{os.getpid()}.json"
        self._taken: set[Path] = set()
        self._lock = threading.Lock()

    def _free_path(self) -> Path:
        """The process's own name for its first attempt in flight, `-<n>` for each one beside it."""
        with self._lock:
            path, n = self.path, 1
            while path in self._taken:
                path = self.directory / f"{self.prefix}{os.getpid()}-{n}.json"
                n += 1
            self._taken.add(path)
            return path

    def begin(self, info: activity.Info) -> Path:
        """Records the attempt; returns its file, for `end`."""
        record = {
            "pid": os.getpid(),
            "task_token": base64.b64encode(info.task_token).decode("ascii"),
            "activity_type": info.activity_type,
            "activity_id": info.activity_id,
            "workflow_id": info.workflow_id,
            "attempt": info.attempt,
            "started": time.time(),
        }
        record["queue"] = self.queue
        record["host"] = self.host
        path = self._free_path()
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.directory, 0o700)
            _write_private(path, json.dumps(record))
        except BaseException:
            self.end(path)
            raise
        return path

    def end(self, path: Path | None = None) -> None:
        path = path or self.path
        path.unlink(missing_ok=True)
        with self._lock:
            self._taken.discard(path)

    def orphans(self) -> list[tuple[Path, dict]]:
        """Unfinished attempts of dead learners of this queue and host: (ledger file, record). Unreadable
        ledgers are removed; ledgers of live processes, other queues and other hosts are left alone."""
        if not self.directory.is_dir():
            return []
        name = re.compile(re.escape(self.prefix) + r"(\d+)(-\d+)?\.json")
        out: list[tuple[Path, dict]] = []
        for path in sorted(self.directory.iterdir()):
            if not name.fullmatch(path.name):
                continue
            try:
                record = json.loads(path.read_text())
                pid = int(record["pid"])
                base64.b64decode(record["task_token"], validate=True)
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError) as e:
                log.warning("ignoring an unreadable in-flight ledger %s: %s", path, e)
                path.unlink(missing_ok=True)
                continue
            if record.get("queue", self.queue) != self.queue or record.get("host", self.host) != self.host:
                continue
            # Same pid as ours: a reused pid (e.g. a restarted container), so the writer is gone.
            if pid != os.getpid() and _alive(pid):
                log.warning("in-flight ledger %s belongs to the running process %d: left alone", path, pid)
                continue
            out.append((path, record))
        return out

    def orphan(self) -> dict | None:
        """The first unfinished attempt a dead predecessor left, or None."""
        found = self.orphans()
        return found[0][1] if found else None


async def release_orphan(client: Client, ledger: InflightLedger) -> str | None:
    """Fails the attempts dead predecessors left running; returns lines saying what happened, or None."""
    lines = [await _release(client, path, record) for path, record in ledger.orphans()]
    return "; ".join(lines) if lines else None


async def _release(client: Client, path: Path, record: dict) -> str:
    what = f"{record.get('activity_type')} of {record.get('workflow_id')} (attempt {record.get('attempt')})"
    handle = client.get_async_activity_handle(task_token=base64.b64decode(record["task_token"]))
    try:
        await handle.fail(
            ApplicationError(
                f"the learner process {record['pid']} died during this attempt; its successor failed it so that the "
                "retry starts now instead of after the heartbeat timeout",
                type="LearnerRestarted",
            )
        )
        line = f"failed the attempt a dead learner left running: {what}; Temporal retries it now"
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        # Timed out, completed or cancelled meanwhile: nothing to release.
        line = f"the attempt a dead learner left running is already over: {what}"
    path.unlink(missing_ok=True)
    return line
