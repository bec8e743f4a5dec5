"""TensorBoard (and W&B offline) curves from a run's metrics rows: every iteration's scalars exactly once,
read back with TensorBoard's own reader, whatever the retries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from halo_learner import curves

LEARNER_DIR = Path(__file__).resolve().parents[1]


def row(it: int, **extra) -> dict:
    r = {
        "run_id": "run-a",
        "iteration": it,
        "time": f"2026-11-21T12:{it:02d}:00.000Z",
        "mean_reward": -0.5 + 0.25 * it,
        "reward_std": 0.3,
        "frac_reward_zero_std": 0.5,
        "episode_length": 3,
        "success_rate": min(1.0, 0.2 * it),
        "mean_return": 1.0,
        "action_validity": 0.9,
        "loss": 0.1 * it,
        "grad_norm": 0.5,
        "adapter_version": it,
        "tokens": 100,
        "kl": 0.01 * it,
        "clip_fraction": 0.125,
        "mean_ratio": 1.0,
        "entropy": 2.5,
        "seconds": {"rollout": 10.0, "update": 2.0},
        "num_groups": 4,
        "num_episodes": 2,
    }
    r.update(extra)
    return r


def append(run_dir: Path, *rows: dict, name: str = "metrics.jsonl") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / name, "a") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def read_back(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / curves.TENSORBOARD_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def steps(acc: EventAccumulator, tag: str) -> list[int]:
    return [e.step for e in acc.Scalars(tag)]


def test_every_iteration_once_across_retries_and_restarts(tmp_path):
    run = tmp_path / "run-a"
    append(run, row(1), row(2))
    first = curves.sync(run)
    assert first["tensorboard"]["written"] == 2
    # A retried activity (or a restarted worker) syncs again: nothing new is written.
    again = curves.sync(run)
    assert again["tensorboard"]["written"] == 0
    # The next iteration, a torn last line (a writer killed mid-append) and a duplicate line for an iteration.
    append(run, row(3), row(2, mean_reward=99.0))
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"run_id": "run-a", "itera')
    # A sync killed mid-write left a partial file behind: it is cleaned up, never read as events.
    (run / curves.TENSORBOARD_DIR / ".partial-123-deadbeef").write_bytes(b"\x00garbage")
    assert curves.sync(run)["tensorboard"]["iterations"] == [3]
    assert curves.sync(run)["tensorboard"]["written"] == 0

    acc = read_back(run)
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/success_rate",
        "train/mean_reward",
        "train/action_validity",
        "learner/loss",
        "learner/grad_norm",
        "learner/kl",
        "learner/clip_fraction",
        "learner/mean_ratio",
        "learner/entropy",
        "seconds/rollout",
    ):
        assert tag in tags, tag
        assert steps(acc, tag) == [1, 2, 3], tag
    assert [e.value for e in acc.Scalars("train/mean_reward")] == [
        -0.25,
        0.0,
        0.25,
    ]  # the first line of iteration 2 wins
    assert [e.value for e in acc.Scalars("learner/kl")] == pytest.approx([0.01, 0.02, 0.03])
    # Wall times are the metrics lines' own times.
    assert acc.Scalars("train/success_rate")[0].wall_time == pytest.approx(curves.wall_time(row(1)))
    assert not list((run / curves.TENSORBOARD_DIR).glob(".partial-*"))
    assert len(list((run / curves.TENSORBOARD_DIR).glob("events.out.tfevents.*"))) == 2


def test_nulls_and_held_out_evaluation(tmp_path):
    run = tmp_path / "run-b"
    append(
        run,
        row(0, loss=None, grad_norm=None, adapter_version=None),
        row(1, eval={"success_rate": 0.5, "mean_return": 1.0, "episodes": 4}),
    )
    curves.sync(run)
    acc = read_back(run)
    assert steps(acc, "learner/loss") == [1]
    assert steps(acc, "train/success_rate") == [0, 1]
    assert steps(acc, "eval/success_rate") == [1]


def mcts_row(it: int, **extra) -> dict:
    r = {
        "run_id": "mcts-a",
        "iteration": it,
        "time": f"2026-11-21T12:{it:02d}:00Z",
        "algorithm": "mcts",
        "success_rate": 0.5,
        "mean_return": 0.5,
        "loss": 0.69,
        "grad_norm": 0.1,
        "adapter_version": it,
        "num_episodes": 2,
        "seconds": {"search": 5.0},
        "mcts": {
            "simulations": 12,
            "nodes": 9,
            "pairs": 3,
            "mean_abs_delta_q": 0.3,
            "pairs_with_ref_logprobs": 0,
            "reward_margin": 0.1,
            "accuracy": 0.5,
            "update_skipped": False,
            "candidates": 6,
            "invalid_candidates": 1,
            "critic_calls": 2,
            "critic_failures": 0,
            "session_rebuilds": 0,
        },
    }
    r.update(extra)
    return r


def test_mcts_rows_share_the_file_and_the_tags_their_section_under_its_name(tmp_path):
    run = tmp_path / "mcts-a"
    append(
        run,
        mcts_row(1),
        mcts_row(
            2,
            loss=None,
            grad_norm=None,
            adapter_version=None,
            eval={"success_rate": 1.0, "mean_return": 1.0, "episodes": 2},
        ),
    )
    assert curves.sync(run)["tensorboard"]["written"] == 2
    assert curves.sync(run)["tensorboard"]["written"] == 0
    acc = read_back(run)
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "train/success_rate",
        "train/mean_return",
        "train/num_episodes",
        "mcts/pairs",
        "mcts/accuracy",
        "mcts/simulations",
        "seconds/search",
    ):
        assert steps(acc, tag) == [1, 2], tag
    assert steps(acc, "learner/loss") == [1]
    assert steps(acc, "eval/success_rate") == [2]
    assert "mcts/update_skipped" not in tags and "train/algorithm" not in tags
    assert [p.name.split(".halo-")[1] for p in (run / curves.TENSORBOARD_DIR).glob("events.out.tfevents.*")] == [
        "mcts-it000001-000002"
    ]


LEGACY_MCTS = {
    "run_id": "mcts-old",
    "time": "2026-11-21T12:00:00Z",
    "searches": 2,
    "simulations": 12,
    "nodes": 9,
    "best_path_success_rate": 0.5,
    "pairs": 3,
    "mean_abs_delta_q": 0.3,
    "pairs_with_ref_logprobs": 0,
    "dpo_loss": 0.69,
    "reward_margin": 0.1,
    "accuracy": 0.5,
    "grad_norm": 0.1,
    "adapter_version": 1,
    "update_skipped": False,
    "candidates": 6,
    "invalid_candidates": 1,
    "critic_calls": 2,
    "critic_failures": 0,
    "session_rebuilds": 0,
    "eval_success_rate": None,
    "seconds": {"search": 5.0},
}


def test_an_old_mcts_run_its_mcts_metrics_file_read_in_the_one_shape(tmp_path):
    run = tmp_path / "mcts-old"
    skipped = {
        **LEGACY_MCTS,
        "iteration": 2,
        "update_skipped": True,
        "dpo_loss": None,
        "grad_norm": None,
        "eval_success_rate": 0.25,
        "failed_searches": 1,
    }
    append(run, {**LEGACY_MCTS, "iteration": 1}, skipped, name=curves.LEGACY_MCTS_METRICS_FILE)
    rows = curves.read_rows(curves.metrics_path(run))
    assert [
        (r["algorithm"], r["success_rate"], r["mean_return"], r["loss"], r["adapter_version"], r["num_episodes"])
        for r in rows
    ] == [("mcts", 0.5, 0.5, 0.69, 1, 2), ("mcts", 0.5, 0.5, None, None, 2)]
    assert (
        rows[1]["failed_episodes"] == 1
        and rows[1]["mcts"]["eval_success_rate"] == 0.25
        and "eval_success_rate" not in rows[0]["mcts"]
    )
    # An event file an older sync wrote for iteration 1 (named by its kind then) counts as written.
    tb = run / curves.TENSORBOARD_DIR
    tb.mkdir()
    (tb / "events.out.tfevents.0000000000.halo-mcts-it000001-000001").write_bytes(b"")
    assert curves.sync(run)["tensorboard"]["iterations"] == [2]
    acc = read_back(run)
    assert steps(acc, "train/success_rate") == [2]
    assert steps(acc, "mcts/eval_success_rate") == [2]
    assert "learner/loss" not in acc.Tags()["scalars"]  # iteration 2 ran no update
    # Once the run has a metrics.jsonl, that is the file read.
    append(run, mcts_row(3, run_id="mcts-old"))
    assert [r["iteration"] for r in curves.read_rows(curves.metrics_path(run))] == [3]


def test_rows_without_an_algorithm_are_grpo_rows(tmp_path):
    assert curves.upgrade_row(row(1)) == row(1)
    assert (
        curves.algorithm_of([row(1)]) == "grpo"
        and curves.algorithm_of([mcts_row(1)]) == "mcts"
        and curves.algorithm_of([]) == "grpo"
    )
    assert curves.algorithm_of([row(1, algorithm="../x")]) == "grpo"  # never a path in an event file's name


def test_command_line_and_a_bad_metrics_file(tmp_path):
    run = tmp_path / "run-c"
    append(run, row(1))
    env = {**os.environ, "PYTHONPATH": str(LEARNER_DIR)}
    out = subprocess.run(
        [sys.executable, "-m", "halo_learner.curves", "--run-dir", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tensorboard"]["iterations"] == [1]
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write("not json\n")
    bad = subprocess.run(
        [sys.executable, "-m", "halo_learner.curves", "--run-dir", str(run)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 1 and "line 2: not JSON" in bad.stderr


def test_wandb_offline_logs_each_iteration_once(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run = tmp_path / "run-w"
    append(run, row(1), row(2))
    res = curves.sync(run, wandb_project="halo-test")
    assert res["wandb"]["iterations"] == [1, 2] and res["wandb"]["mode"] == "offline"
    assert curves.sync(run, wandb_project="halo-test")["wandb"]["written"] == 0
    # W&B names an offline run's folder after the second it started: a sync within the same second as the
    # first would write into that folder (syncs are iterations apart in a run, seconds at least).
    time.sleep(1.1)
    append(run, row(3))
    assert curves.sync(run, wandb_project="halo-test")["wandb"]["iterations"] == [3]
    offline = sorted((run / "wandb").glob("offline-run-*-run-w"))
    assert len(offline) == 2, offline  # one offline run folder per sync that logged, all with the run's id
    # The history records W&B wrote hold each iteration's step once.
    logged = [
        (int(h["_step"]), json.loads(h["train/success_rate"]))
        for d in offline
        for h in wandb_history(next(d.glob("*.wandb")))
    ]
    assert sorted(s for s, _ in logged) == [1, 2, 3]
    assert dict(logged)[3] == pytest.approx(0.6)
    del wandb


def wandb_history(path: Path) -> list[dict]:
    """The history rows of a W&B transaction log (`.wandb`): a 7-byte header, then LevelDB-log records
    (crc32c, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks, each holding
    one serialised `Record` proto."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    rows, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left  # block trailer padding
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if length == 0 and kind == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(chunk)
            chunk = b""
            if rec.WhichOneof("record_type") == "history":
                row = {(i.key or "/".join(i.nested_key)): i.value_json for i in rec.history.item}
                rows.append({"_step": str(rec.history.step.num), **row})
    return rows
