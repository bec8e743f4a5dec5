"""A watchdog over the learner's activity slots.

The learner serves one update at a time, beside sampling calls batched together (sample_batcher.py), all on
one GPU. If an attempt never completes (an exception that could not be reported, a deadlock in native code),
its slot stays taken and the GPU with it: Temporal times the attempt out and schedules retries that nothing
serves, and every run on this learner stalls with nothing in any log. The watchdog sees the slots from the
event loop's side (an activity interceptor, so it also catches an attempt whose executor thread is long gone)
and, once a slot has been busy past its activity's own timeout plus a grace period, says so in the log, leaves
a record for `halo doctor`, and restarts the process in place.
The restarted learner fails whatever its predecessor's in-flight ledger still names (inflight.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

log = logging.getLogger("halo_learner.watchdog")


@dataclass
class Busy:
    activity_type: str
    workflow_id: str | None
    attempt: int
    started: float  # time.monotonic()
    started_wall: float  # time.time()
    timeout_s: float | None  # start-to-close, else schedule-to-close; None: no limit to watch


class SlotWatch:
    """What occupies the slots, as the event loop sees it."""

    def __init__(self) -> None:
        self.busy: dict[int, Busy] = {}
        self._lock = threading.Lock()
        self._next = 0

    def begin(self, info: activity.Info) -> int:
        """Marks a slot busy; returns its key, for `end`."""
        limit = info.start_to_close_timeout or info.schedule_to_close_timeout
        with self._lock:
            self._next += 1
            self.busy[self._next] = Busy(
                info.activity_type,
                info.workflow_id,
                info.attempt,
                time.monotonic(),
                time.time(),
                limit.total_seconds() if limit else None,
            )
            return self._next

    def end(self, key: int) -> None:
        with self._lock:
            self.busy.pop(key, None)

    def overdue(self, grace_s: float, now: float | None = None) -> tuple[Busy, float] | None:
        """(what, seconds busy) of a slot busy past its activity's timeout plus `grace_s`, the longest first."""
        now = time.monotonic() if now is None else now
        with self._lock:
            found = [(b, now - b.started) for b in self.busy.values() if b.timeout_s is not None]
        late = [(b, held) for b, held in found if held > b.timeout_s + grace_s]
        return max(late, key=lambda x: x[1]) if late else None

    def interceptor(self) -> Interceptor:
        watch = self

        class _Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                key = watch.begin(activity.info())
                try:
                    return await self.next.execute_activity(input)
                finally:
                    watch.end(key)

        class _Interceptor(Interceptor):
            def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
                return _Inbound(next)

        return _Interceptor()


def event_path(directory: Path, queue: str, host: str | None = None) -> Path:
    return directory / f"watchdog-{queue}-{host or socket.gethostname()}.json"


def restart_in_place() -> None:
    """Replaces this process with a fresh learner (same pid, arguments and environment)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os.execv(sys.executable, [sys.executable, "-m", "halo_learner.worker"])


class Watchdog:
    """A daemon thread that checks the slots every `poll_s` seconds."""

    def __init__(
        self,
        watch: SlotWatch,
        record: Path,
        grace_s: float = 30.0,
        poll_s: float = 5.0,
        restart: Callable[[], None] = restart_in_place,
    ):
        self.watch, self.record, self.grace_s, self.poll_s, self.restart = watch, record, grace_s, poll_s, restart
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="learner-watchdog", daemon=True)

    @classmethod
    def from_env(cls, watch: SlotWatch, record: Path) -> "Watchdog":
        return cls(
            watch,
            record,
            grace_s=float(os.environ.get("HALO_WATCHDOG_GRACE_S", 30)),
            poll_s=float(os.environ.get("HALO_WATCHDOG_POLL_S", 5)),
        )

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.poll_s + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            found = self.watch.overdue(self.grace_s)
            if found is not None:
                self.fire(*found)
                return

    def fire(self, busy: Busy, held_s: float) -> None:
        what = f"{busy.activity_type} of {busy.workflow_id} (attempt {busy.attempt})"
        message = (
            f"a learner activity slot has been busy with {what} for {held_s:.0f} s, past the activity's "
            f"{busy.timeout_s:.0f} s timeout: the attempt will never complete here; restarting the learner"
        )
        log.error(message)
        print(f"halo-learner watchdog: {message}", flush=True)
        event = {
            "at": time.time(),
            "pid": os.getpid(),
            "activity_type": busy.activity_type,
            "workflow_id": busy.workflow_id,
            "attempt": busy.attempt,
            "busy_s": round(held_s, 1),
            "timeout_s": busy.timeout_s,
            "message": message,
        }
        try:
            self.record.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.record.with_name(self.record.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(event))
            os.replace(tmp, self.record)
        except OSError as e:
            log.warning("could not write the watchdog record %s: %s", self.record, e)
        self.restart()
