"""The learner as a real Temporal worker: SIGKILL it mid-update, restart it, and the retried activity
finishes with exactly one v<N> folder and no temp folders. Also: a bad payload fails non-retryably."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from conftest import messages, png_ref, tokens_ref
from halo_learner.blobs import BlobStore

REPO = Path(__file__).resolve().parents[3]
LEARNER_DIR = Path(__file__).resolve().parents[1]


@workflow.defn(name="learner_update_once")
class UpdateOnce:
    """The smallest caller of update_policy: what trainGrpo does for one iteration."""

    @workflow.run
    async def run(self, args: dict) -> dict:
        return await workflow.execute_activity(
            "update_policy",
            args["input"],
            task_queue=args["queue"],
            start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(seconds=args.get("heartbeat_s", 3)),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5),
        )


def _start_learner(address: str, queue: str, checkpoints: Path, blob_home: Path, log: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        TEMPORAL_ADDRESS=address,
        HALO_GPU_QUEUE=queue,
        HALO_MODEL="tiny-random",
        HALO_CHECKPOINTS=str(checkpoints),
        HALO_HOME=str(blob_home),
        HALO_MICRO_BATCH="1",
        HALO_TORCH_THREADS="1",
        PYTHONPATH=str(LEARNER_DIR),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "halo_learner.worker"],
        env=env,
        cwd=str(REPO),
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def _wait_ready(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "halo-learner ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"learner did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


@pytest.fixture
def halo_home(tmp_path):
    # The worker reads blobs from $HALO_HOME/blobs and finds the tiny model (already built) under
    # $HALO_HOME/models: link the session's model cache in.
    home = tmp_path / "home"
    (home / "blobs").mkdir(parents=True)
    models = Path(os.environ["HALO_HOME"]) / "models"
    from halo_learner.models import ensure_tiny_random

    ensure_tiny_random(models)
    (home / "models").symlink_to(models)
    return home


async def _heartbeat_seen(handle) -> bool:
    desc = await handle.describe()
    for pa in desc.raw_description.pending_activities:
        if pa.activity_type.name == "update_policy" and pa.HasField("last_heartbeat_time"):
            return True
    return False


@pytest.mark.parametrize("heartbeat_s", [3, 600], ids=["heartbeat-timeout", "successor-releases"])
def test_sigkill_mid_update_then_retry_writes_one_version(temporal_server, halo_home, tmp_path, heartbeat_s):
    """heartbeat-timeout: Temporal notices the dead attempt after 3 s. successor-releases: with a 10-minute
    heartbeat timeout only the restarted learner, failing its predecessor's attempt through the task token it
    left on disk, can get the update retried within the test's time limit."""
    blobs = BlobStore(halo_home / "blobs")
    rnd = random.Random(0)
    # A long batch: many groups, micro-batch 1, so the update takes seconds and heartbeats per chunk.
    items = []
    for g in range(60):
        m = messages(png_ref(blobs, 128, 96, g), f"Goal: task {g}")
        for _ in range(4):
            items.append(
                {
                    "prompt": m,
                    "completion": "",
                    "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(48)]),
                    "advantage": rnd.uniform(-1, 1),
                }
            )
    batch_ref = blobs.put_json({"items": items, "max_completion_len": 48})
    checkpoints = tmp_path / "checkpoints"
    queue = f"gpu-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "learner.log"
    first = _start_learner(temporal_server, queue, checkpoints, halo_home, log)
    second = None
    try:
        _wait_ready(log, first)

        async def scenario():
            nonlocal second
            client = await Client.connect(temporal_server)
            wf_queue = f"wf-{queue}"
            async with Worker(
                client, task_queue=wf_queue, workflows=[UpdateOnce], workflow_runner=UnsandboxedWorkflowRunner()
            ):
                handle = await client.start_workflow(
                    UpdateOnce.run,
                    {
                        "queue": queue,
                        "heartbeat_s": heartbeat_s,
                        "input": {
                            "run_id": "killrun",
                            "version": 1,
                            "batch_ref": batch_ref,
                            "hyperparameters": {"learning_rate": 1e-3, "kl_coef": 0.001},
                        },
                    },
                    id=f"update-{queue}",
                    task_queue=wf_queue,
                )
                deadline = time.monotonic() + 60
                while not await _heartbeat_seen(handle):
                    assert time.monotonic() < deadline, "no heartbeat from the learner"
                    await asyncio.sleep(0.1)
                first.send_signal(signal.SIGKILL)
                first.wait(10)
                killed_at = time.monotonic()
                assert not (checkpoints / "killrun" / "v1").exists(), "update finished before the kill"
                second = _start_learner(temporal_server, queue, checkpoints, halo_home, log)
                result = await asyncio.wait_for(handle.result(), 240 if heartbeat_s < 240 else heartbeat_s / 3)
                attempts = [
                    e.activity_task_started_event_attributes.attempt
                    async for e in handle.fetch_history_events()
                    if e.HasField("activity_task_started_event_attributes")
                ]
                return result, attempts, time.monotonic() - killed_at

        result, attempts, recovery_s = asyncio.run(scenario())
        print(f"\nretried after SIGKILL: attempts {attempts}, recovered in {recovery_s:.1f}s, result {result}")
        assert result["version"] == 1 and result["reused"] is False and result["tokens"] == 240 * 48
        assert max(attempts) >= 2
        released = "failed the attempt a dead learner left running: update_policy" in log.read_text(errors="replace")
        # With a short heartbeat timeout the server may fail the attempt first; with a long one the successor must.
        assert released or heartbeat_s < 240
        assert not list((halo_home / "learner").glob(f"inflight-{queue}-*.json")), (
            "the ledger is cleared after the update"
        )
        run_dir = checkpoints / "killrun"
        assert sorted(p.name for p in run_dir.iterdir()) == ["v1"]  # no temp folders, one version
        assert {p.name for p in (run_dir / "v1").iterdir()} >= {
            "adapter_config.json",
            "adapter_model.safetensors",
            "manifest.json",
        }
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_bad_payload_fails_without_retry(temporal_server, halo_home, tmp_path):
    queue = f"gpu-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "learner.log"
    proc = _start_learner(temporal_server, queue, tmp_path / "checkpoints", halo_home, log)
    try:
        _wait_ready(log, proc)

        async def scenario():
            client = await Client.connect(temporal_server)
            async with Worker(
                client, task_queue=f"wf-{queue}", workflows=[UpdateOnce], workflow_runner=UnsandboxedWorkflowRunner()
            ):
                with pytest.raises(WorkflowFailureError) as err:
                    await client.execute_workflow(
                        UpdateOnce.run,
                        {
                            "queue": queue,
                            "input": {
                                "run_id": "bad",
                                "version": 1,
                                "batch_ref": "sha256:" + "0" * 64 + ".json",
                                "hyperparameters": {"loss_type": "grpo"},
                            },
                        },
                        id=f"bad-{queue}",
                        task_queue=f"wf-{queue}",
                    )
                return err.value.cause.cause

        app = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert app.non_retryable and app.type == "InvalidPayload"
        assert "hyperparameters.loss_type" in app.message and "dr_grpo" in app.message
    finally:
        proc.terminate()
        proc.wait(30)
