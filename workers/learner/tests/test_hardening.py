"""Run ids that would leave the checkpoints folder are refused; in-flight ledgers are private and per process."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from halo_learner import adapters
from halo_learner.activities import LearnerActivities
from halo_learner.inflight import InflightLedger
from halo_learner.payloads import SampleActionsInput, UpdateDpoInput, UpdatePolicyInput

BAD_RUN_IDS = ["..", ".", "../x", "a/../../b", "a/b", "/abs", "", ".hidden", "-rf", "a\\b", "x" * 201, "é"]
GOOD_RUN_IDS = ["grpo-local", "a", "run.1_x-2", "A" * 200]
REF = "sha256:" + "a" * 64 + ".json"


@pytest.mark.parametrize("run_id", BAD_RUN_IDS)
def test_path_escaping_run_ids_are_refused_by_every_request(run_id):
    for model, raw in [
        (UpdatePolicyInput, {"version": 1, "batch_ref": REF}),
        (UpdateDpoInput, {"version": 1, "batch_ref": REF}),
        (SampleActionsInput, {"prompt_ref": REF}),
    ]:
        with pytest.raises(ValidationError, match="run_id"):
            model.model_validate({"run_id": run_id, **raw})
    with pytest.raises(ValueError, match="invalid run id"):
        adapters.version_dir(run_id, 1, Path("/tmp/ckpt"))


@pytest.mark.parametrize("run_id", GOOD_RUN_IDS)
def test_ordinary_run_ids_are_accepted(run_id):
    assert UpdatePolicyInput.model_validate({"run_id": run_id, "version": 1, "batch_ref": REF}).run_id == run_id
    assert adapters.version_dir(run_id, 3, Path("/tmp/ckpt")) == Path("/tmp/ckpt") / run_id / "v3"


def test_the_activity_fails_a_dotdot_run_id_without_retry():
    # The input is checked before the learner is touched: no model needed.
    never = SimpleNamespace(update_policy=None, update_dpo=None, sample_actions=None)
    acts = LearnerActivities(never)
    for call, extra in [
        (acts.update_policy, {"batch_ref": REF}),
        (acts.update_dpo, {"batch_ref": REF}),
        (acts.sample_actions, {"prompt_ref": REF}),
    ]:
        with pytest.raises(ApplicationError) as e:
            call({"run_id": "..", "version": 1, **extra})
        assert e.value.non_retryable and e.value.type == "InvalidPayload" and "run_id" in e.value.message


def _info(token: bytes = b"\x01\x02"):
    return SimpleNamespace(
        task_token=token, activity_type="update_policy", activity_id="1", workflow_id="wf", attempt=1
    )


def _dead_pid() -> int:
    p = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(p.stdout)


def test_ledger_is_private_and_named_by_queue_host_and_pid(tmp_path):
    old = os.umask(0o022)
    try:
        folder = tmp_path / "learner"
        ledger = InflightLedger(folder, "gpu")
        ledger.begin(_info())
    finally:
        os.umask(old)
    assert ledger.path.name == f"inflight-gpu-{ledger.host}-{os.getpid()}.json"
    assert stat.S_IMODE(ledger.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert json.loads(ledger.path.read_text())["task_token"] == base64.b64encode(b"\x01\x02").decode()
    assert [p.name for p in folder.iterdir()] == [ledger.path.name], "no temp file left behind"
    ledger.end()
    assert not ledger.path.exists()


def test_attempts_in_flight_together_have_a_file_each(tmp_path):
    folder = tmp_path / "learner"
    ledger = InflightLedger(folder, "gpu", host="h1")
    first, second, third = (ledger.begin(_info(bytes([i]))) for i in (1, 2, 3))
    pid = os.getpid()
    assert [first.name, second.name, third.name] == [
        f"inflight-gpu-h1-{pid}.json",
        f"inflight-gpu-h1-{pid}-1.json",
        f"inflight-gpu-h1-{pid}-2.json",
    ]
    ledger.end(second)
    assert sorted(p.name for p in folder.iterdir()) == sorted([first.name, third.name])
    assert ledger.begin(_info(b"\x04")) == second, "a finished attempt's name is free again"
    # A successor (same pid, as after a restart in place) finds every attempt its predecessor left.
    tokens = sorted(r["task_token"] for _, r in InflightLedger(folder, "gpu", host="h1").orphans())
    assert tokens == sorted(base64.b64encode(bytes([i])).decode() for i in (1, 3, 4))


def test_orphans_are_dead_processes_of_this_queue_and_host_only(tmp_path):
    folder = tmp_path / "learner"
    folder.mkdir()
    me = InflightLedger(folder, "gpu", host="h1")
    dead, live = _dead_pid(), os.getppid()

    def write(name: str, pid: int, **extra):
        rec = {
            "pid": pid,
            "task_token": base64.b64encode(b"t").decode(),
            "activity_type": "update_policy",
            "workflow_id": "wf",
            "attempt": 1,
            **extra,
        }
        (folder / name).write_text(json.dumps(rec))

    write(f"inflight-gpu-h1-{dead}.json", dead, queue="gpu", host="h1")  # a dead predecessor: released
    write(f"inflight-gpu-h1-{live}.json", live, queue="gpu", host="h1")  # alive: left alone
    write(f"inflight-gpu-h2-{dead}.json", dead, queue="gpu", host="h2")  # another host's learner
    write(f"inflight-gpu-2-h1-{dead}.json", dead, queue="gpu-2", host="h1")  # another queue
    write("inflight-gpu.json", dead)  # not a per-process ledger
    found = [p.name for p, _ in me.orphans()]
    assert found == [f"inflight-gpu-h1-{dead}.json"]
