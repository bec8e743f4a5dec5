"""A run's metrics as TensorBoard event files (and Weights & Biases runs when configured), each iteration once.

    python -m halo_learner.curves --run-dir runs/<run>
        [--wandb-project P] [--wandb-entity E] [--wandb-mode online|offline|disabled]

The source is the run's metrics file, `metrics.jsonl`, one schema for every algorithm (lib/training/run-metrics.ts),
which already holds exactly one line per iteration (activities/iteration-log.ts). An MCTS run from before
that file was shared has `mcts-metrics.jsonl` instead: it is read when there is no metrics.jsonl, its lines
converted to the same shape (`upgrade_row`, as lib/training/run-metrics.ts does). A sync writes the iterations that no
event file holds yet, and nothing else, so running it any number of times (a retried activity, a restarted
worker, `halo report` catching up) leaves every iteration's scalars in the event files exactly once:

- the rows go into one new file, `<run>/tensorboard/events.out.tfevents.<time>.halo-<algorithm>-it<first>-<last>`,
  written under a temporary name (without "tfevents", so TensorBoard never reads it half-written), flushed,
  fsynced and renamed into place: a file is either all there or not there;
- the iterations already written are read back from those names (the range each file covers);
- one sync at a time per run folder (an exclusive lock), so two processes never write the same iteration.

Files are named by the wall time of their first row (the metrics line's own `time`) and hold rows in
iteration order, so TensorBoard's directory watcher reads them in order while a run is live. The event
records are written with TensorBoard's own record writer and protos (the `tensorboard` package).

Weights & Biases (optional: the `wandb` package is imported only when a project is given): the same rows are
logged with `step = iteration` to the W&B run `<run>` (resumed across syncs; offline mode keeps it under
`<run>/wandb/` for `wandb sync`). A ledger, `<run>/wandb/halo-logged-<algorithm>.json`, written after the W&B run
has finished, keeps each iteration from being logged again by a later sync.

Prints one JSON line: {"tensorboard": {"dir", "written", "iterations"}, "wandb": {...} | null}. Exit status 3
when a needed package is not installed (the message names it), 2 on bad arguments, 1 on other errors.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import re
import sys
import uuid
from calendar import timegm
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator

from .paths import fsync_dir

METRICS_FILE = "metrics.jsonl"
LEGACY_MCTS_METRICS_FILE = "mcts-metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
LOCK_FILE = ".curves.lock"

# Tags: `<group>/<key>`. The learner's numbers of the update under `learner/`, every other top-level number
# (the common keys and GRPO's own) under `train/`, and each object under its own key: the per-phase seconds
# under `seconds/`, held-out evaluation under `eval/`, an algorithm's section under its name (`mcts/`).
LEARNER_KEYS = frozenset(
    {
        "loss",
        "grad_norm",
        "kl",
        "clip_fraction",
        "mean_ratio",
        "entropy",
        "tokens",
        "retokenized",
        "token_mismatch_rate",
        "unknown_logprobs",
        "prompt_mismatch_rate",
    }
)
SKIP_KEYS = frozenset({"run_id", "iteration", "time"})

# The flat keys of an old mcts-metrics.jsonl line that went into the `mcts` section.
_LEGACY_MCTS_SECTION = (
    "simulations",
    "nodes",
    "pairs",
    "mean_abs_delta_q",
    "pairs_with_ref_logprobs",
    "reward_margin",
    "accuracy",
    "update_skipped",
    "candidates",
    "invalid_candidates",
    "critic_calls",
    "critic_failures",
    "session_rebuilds",
)

_EVENT_NAME = re.compile(r"^events\.out\.tfevents\.\d+\.halo-(?P<algorithm>[a-z]+)-it(?P<first>\d+)-(?P<last>\d+)$")


class MissingPackage(RuntimeError):
    """A package the sink needs is not installed."""


def metrics_path(run_dir: Path) -> Path:
    """The run's metrics.jsonl, or an old MCTS run's mcts-metrics.jsonl when that is the only one there."""
    current = run_dir / METRICS_FILE
    legacy = run_dir / LEGACY_MCTS_METRICS_FILE
    return legacy if not current.exists() and legacy.exists() else current


def upgrade_row(row: dict) -> dict:
    """An old mcts-metrics.jsonl line in the shape of metrics.jsonl (lib/training/run-metrics.ts, `fromLegacyMctsLine`:
    the searches' best-path success rate is the success rate and the mean return, the DPO loss the loss, no
    adapter version when the update was skipped); any other row as it is."""
    if "algorithm" in row or "searches" not in row or "best_path_success_rate" not in row:
        return row
    out = {
        "run_id": row.get("run_id"),
        "iteration": row["iteration"],
        "time": row.get("time"),
        "algorithm": "mcts",
        "success_rate": row["best_path_success_rate"],
        "mean_return": row["best_path_success_rate"],
        "loss": row.get("dpo_loss"),
        "grad_norm": row.get("grad_norm"),
        "adapter_version": None if row.get("update_skipped") else row.get("adapter_version"),
        "num_episodes": row["searches"],
        "seconds": row.get("seconds", {}),
    }
    if row.get("failed_searches") is not None:
        out["failed_episodes"] = row["failed_searches"]
    section = {k: row[k] for k in _LEGACY_MCTS_SECTION if k in row}
    if row.get("eval_success_rate") is not None:
        section["eval_success_rate"] = row["eval_success_rate"]
    out["mcts"] = section
    return out


def algorithm_of(rows: list[dict]) -> str:
    """The run's algorithm (rows without one were written by GRPO runs)."""
    a = rows[0].get("algorithm", "grpo") if rows else "grpo"
    return a if isinstance(a, str) and re.fullmatch(r"[a-z]+", a) else "grpo"


def read_rows(path: Path) -> list[dict]:
    """The metrics file's lines in iteration order, read as the TypeScript reader reads them: blank lines
    skipped, a torn last line (no newline yet) ignored, the first line of an iteration wins, old MCTS lines
    upgraded."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = text.split("\n")
    out: dict[int, dict] = {}
    for i, raw in enumerate(rows):
        raw = raw.strip()
        if not raw:
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as err:
            if i == len(rows) - 1:
                continue  # torn write
            raise ValueError(f"{path} line {i + 1}: not JSON") from err
        it = row.get("iteration") if isinstance(row, dict) else None
        if not isinstance(it, int) or isinstance(it, bool) or it < 0:
            raise ValueError(f"{path} line {i + 1}: no iteration")
        out.setdefault(it, upgrade_row(row))
    return [out[k] for k in sorted(out)]


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def scalars(row: dict) -> dict[str, float]:
    """One row's scalars by tag: numbers only (nulls, strings and booleans left out), nested objects one level
    deep (`seconds/rollout`, `eval/success_rate`, `mcts/pairs`)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in SKIP_KEYS:
            continue
        if isinstance(value, dict):
            for sub, v in value.items():
                n = _number(v)
                if n is not None:
                    out[f"{key}/{sub}"] = n
            continue
        n = _number(value)
        if n is None:
            continue
        out[f"learner/{key}" if key in LEARNER_KEYS else f"train/{key}"] = n
    return out


def wall_time(row: dict) -> float:
    """The row's own ISO time in seconds since the epoch (0 when it has none)."""
    t = row.get("time")
    if not isinstance(t, str):
        return 0.0
    try:
        d = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return timegm(d.utctimetuple()) + d.microsecond / 1e6


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One sync at a time per run folder, across processes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_FILE, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def written_ranges(tb_dir: Path) -> list[tuple[int, int]]:
    """The iteration ranges the run's finished event files cover (a run has one metrics file, so every file
    of ours in its folder holds iterations of that file, whichever algorithm named it)."""
    if not tb_dir.is_dir():
        return []
    out = []
    for p in tb_dir.iterdir():
        m = _EVENT_NAME.match(p.name)
        if m:
            out.append((int(m["first"]), int(m["last"])))
    return sorted(out)


def _covered(it: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(a <= it <= b for a, b in ranges)


def _tensorboard():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingPackage(
            f"the tensorboard package is not installed ({err}); pip install -r workers/learner/requirements.txt"
        ) from err
    return event_pb2, summary_pb2, RecordWriter


def sync_tensorboard(run_dir: Path, rows: list[dict]) -> dict:
    """Writes the rows no event file holds yet into one new event file. Call under `run_lock`."""
    tb_dir = run_dir / TENSORBOARD_DIR
    tb_dir.mkdir(parents=True, exist_ok=True)
    for p in tb_dir.glob(".partial-*"):  # a sync killed mid-write; we hold the lock, so nobody else is writing
        p.unlink(missing_ok=True)
    ranges = written_ranges(tb_dir)
    todo = [r for r in rows if not _covered(r["iteration"], ranges)]
    if not todo:
        return {"dir": str(tb_dir), "written": 0, "iterations": []}
    event_pb2, summary_pb2, RecordWriter = _tensorboard()
    first, last = todo[0], todo[-1]
    stamp = int(wall_time(first))
    name = (
        f"events.out.tfevents.{stamp:010d}.halo-{algorithm_of(todo)}-it{first['iteration']:06d}-{last['iteration']:06d}"
    )
    tmp = tb_dir / f".partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(event_pb2.Event(wall_time=wall_time(first), file_version="brain.Event:2").SerializeToString())
        for row in todo:
            values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in sorted(scalars(row).items())]
            event = event_pb2.Event(
                wall_time=wall_time(row), step=row["iteration"], summary=summary_pb2.Summary(value=values)
            )
            writer.write(event.SerializeToString())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, tb_dir / name)
    fsync_dir(tb_dir)
    return {"dir": str(tb_dir), "written": len(todo), "iterations": [r["iteration"] for r in todo], "file": name}


def _wandb_id(run_id: str, algorithm: str) -> str:
    # MCTS runs had a W&B run of their own id before the metrics files were one; they keep it.
    base = re.sub(r"[^A-Za-z0-9_-]", "-", run_id)
    return base if algorithm == "grpo" else f"{base}-{algorithm}"


def sync_wandb(
    run_dir: Path, rows: list[dict], *, project: str, entity: str | None = None, mode: str | None = None
) -> dict:
    """Logs the rows the ledger does not list yet to the run's W&B run. Call under `run_lock`."""
    algorithm = algorithm_of(rows)
    wb_dir = run_dir / WANDB_DIR
    wb_dir.mkdir(parents=True, exist_ok=True)
    ledger = wb_dir / f"halo-logged-{algorithm}.json"
    try:
        done = set(json.loads(ledger.read_text())["iterations"])
    except FileNotFoundError:
        done = set()
    todo = [r for r in rows if r["iteration"] not in done]
    out = {
        "dir": str(wb_dir),
        "project": project,
        "mode": mode,
        "written": len(todo),
        "iterations": [r["iteration"] for r in todo],
    }
    if not todo:
        return out
    try:
        import wandb
    except ImportError as err:
        raise MissingPackage(
            f"wandb is configured (project {project}) but the wandb package is not installed ({err}): pip install wandb"
        ) from err
    run_id = run_dir.name
    run = wandb.init(
        project=project,
        entity=entity or None,
        mode=mode or None,
        dir=str(run_dir),
        id=_wandb_id(run_id, algorithm),
        name=run_id if algorithm == "grpo" else f"{run_id} ({algorithm})",
        resume="allow",
        job_type=algorithm,
        config={"halo_run_id": run_id, "algorithm": algorithm},
        settings=wandb.Settings(silent=True, console="off"),
    )
    try:
        for row in todo:
            run.log(scalars(row), step=row["iteration"])
    finally:
        run.finish()
    out["mode"] = mode or os.environ.get("WANDB_MODE") or "online"
    tmp = ledger.with_name(f".{ledger.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"iterations": sorted(done | {r["iteration"] for r in todo})}))
    os.replace(tmp, ledger)
    return out


def sync(
    run_dir: Path, *, wandb_project: str | None = None, wandb_entity: str | None = None, wandb_mode: str | None = None
) -> dict:
    """TensorBoard (always) and W&B (when a project is given) up to date with the run's metrics file."""
    run_dir = Path(run_dir)
    with run_lock(run_dir):
        rows = read_rows(metrics_path(run_dir))
        tb = sync_tensorboard(run_dir, rows)
        wb = (
            sync_wandb(run_dir, rows, project=wandb_project, entity=wandb_entity, mode=wandb_mode)
            if wandb_project
            else None
        )
    return {"tensorboard": tb, "wandb": wb}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m halo_learner.curves", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True, help="the run's folder (holds metrics.jsonl)")
    ap.add_argument("--wandb-project")
    ap.add_argument("--wandb-entity")
    ap.add_argument("--wandb-mode", choices=["online", "offline", "disabled"])
    args = ap.parse_args(argv)
    try:
        result = sync(
            Path(args.run_dir),
            wandb_project=args.wandb_project,
            wandb_entity=args.wandb_entity,
            wandb_mode=args.wandb_mode,
        )
    except MissingPackage as err:
        print(f"halo curves: {err}", file=sys.stderr)
        return 3
    except Exception as err:  # noqa: BLE001 - the caller logs the message
        print(f"halo curves: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
