"""A watchdog over the learner's one activity slot.

The learner serves one activity at a time (`max_concurrent_activities=1`). If an attempt never completes (an
exception that could not be reported, a deadlock in native code), the slot stays taken: Temporal times the
attempt out and schedules retries that no worker picks up, and every run on this learner stalls with nothing
in any log. The watchdog sees the slot from the event loop's side (an activity interceptor, so it also catches an
attempt whose executor thread is long gone) and, once the slot has been busy past the activity's own timeout
plus a grace period, says so in the log, leaves a record for `halo doctor`, and restarts the process in place.
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
    """What occupies the slot, as the event loop sees it."""

    def __init__(self) -> None:
        self.busy: Busy | None = None
        self._lock = threading.Lock()

    def begin(self, info: activity.Info) -> None:
        limit = info.start_to_close_timeout or info.schedule_to_close_timeout
        with self._lock:
            self.busy = Busy(
                info.activity_type,
                info.workflow_id,
                info.attempt,
                time.monotonic(),
                time.time(),
                limit.total_seconds() if limit else None,
            )

    def end(self) -> None:
        with self._lock:
            self.busy = None

    def overdue(self, grace_s: float, now: float | None = None) -> tuple[Busy, float] | None:
        """(what, seconds busy) when the slot has been busy past the activity's timeout plus `grace_s`."""
        with self._lock:
            b = self.busy
        if b is None or b.timeout_s is None:
            return None
        held = (time.monotonic() if now is None else now) - b.started
        return (b, held) if held > b.timeout_s + grace_s else None

    def interceptor(self) -> Interceptor:
        watch = self

        class _Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                watch.begin(activity.info())
                try:
                    return await self.next.execute_activity(input)
                finally:
                    watch.end()

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
    """A daemon thread that checks the slot every `poll_s` seconds."""

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
            f"the learner's activity slot has been busy with {what} for {held_s:.0f} s, past the activity's "
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
