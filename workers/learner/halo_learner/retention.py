"""Adapter retention: what of checkpoints/<run_id>/v<N>/ to keep.

For the 8B an adapter is ~0.17 GiB and its AdamW moments ~0.35 GiB, so 200 whole versions are ~100 GiB.
Rules, per run:
  * the last `keep_last` versions stay whole (the newest is the parent of the next update, and a few more
    let a run resume from a slightly older point);
  * an older version loses its optimiser state (weights, config and manifest stay: vLLM can still serve it,
    an evaluation can still load it); the learner applies this rule by itself after every update;
  * an older version is deleted only when the caller asks for deletion (`halo gc`) and it is neither a
    multiple of `keep_every` nor in `needed` (versions a running run, an evaluation or a served model uses);
  * a version in `needed` is never touched.

    python -m halo_learner.retention --run <run_id> [--keep-last 3] [--keep-every 10] [--need 7 --need 12]
                                     [--delete] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .adapters import MANIFEST_FILE, OPTIMIZER_FILE, read_manifest, version_dir

DEFAULT_KEEP_LAST = 3
DEFAULT_KEEP_EVERY = 10


@dataclass(frozen=True)
class Action:
    kind: str  # "strip-optimizer" | "delete"
    version: int
    path: Path
    bytes: int


def versions(run_dir: Path) -> dict[int, Path]:
    out = {}
    for p in run_dir.glob("v*"):
        if p.is_dir() and p.name[1:].isdigit() and (p / MANIFEST_FILE).exists():
            out[int(p.name[1:])] = p
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def plan(run_dir: Path, keep_last: int = DEFAULT_KEEP_LAST, keep_every: int = DEFAULT_KEEP_EVERY,
         needed: set[int] | frozenset[int] = frozenset(), delete: bool = False) -> list[Action]:
    """What retention would do to one run's folder; nothing is changed."""
    found = versions(run_dir)
    whole = set(sorted(found)[-keep_last:]) if keep_last > 0 else set()
    actions = []
    for v, path in sorted(found.items()):
        if v in whole or v in needed:
            continue
        milestone = keep_every > 0 and v % keep_every == 0
        if delete and not milestone:
            actions.append(Action("delete", v, path, _size(path)))
        elif (path / OPTIMIZER_FILE).exists():
            actions.append(Action("strip-optimizer", v, path, (path / OPTIMIZER_FILE).stat().st_size))
    return actions


def apply(actions: list[Action]) -> int:
    """Carry out `plan`'s actions; returns the bytes freed."""
    freed = 0
    for a in actions:
        if a.kind == "delete":
            # Rename first so a half-deleted folder never looks like a complete version.
            doomed = a.path.with_name(f".{a.path.name}.deleting")
            os.rename(a.path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        else:
            _strip_optimizer(a.path)
        freed += a.bytes
    return freed


def _strip_optimizer(path: Path) -> None:
    m = read_manifest(path)
    m["files"].pop(OPTIMIZER_FILE, None)
    m["optimizer_pruned"] = True
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".manifest-")
    with os.fdopen(fd, "w") as f:
        json.dump(m, f, indent=2)
    os.replace(tmp, path / MANIFEST_FILE)  # manifest first: it never lists a file that is gone
    (path / OPTIMIZER_FILE).unlink(missing_ok=True)


def prune_after_update(root: Path | None, run_id: str, keep_last: int = DEFAULT_KEEP_LAST) -> int:
    """The learner's own, safe part of retention: optimiser state of versions older than the last K."""
    run_dir = version_dir(run_id, 0, root).parent
    return apply(plan(run_dir, keep_last=keep_last, keep_every=0, delete=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m halo_learner.retention", description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--root", type=Path, default=None, help="checkpoints folder (default HALO_CHECKPOINTS)")
    ap.add_argument("--keep-last", type=int, default=DEFAULT_KEEP_LAST)
    ap.add_argument("--keep-every", type=int, default=DEFAULT_KEEP_EVERY)
    ap.add_argument("--need", type=int, action="append", default=[])
    ap.add_argument("--delete", action="store_true", help="delete old versions, not only their optimiser state")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    run_dir = version_dir(args.run, 0, args.root).parent
    actions = plan(run_dir, args.keep_last, args.keep_every, set(args.need), args.delete)
    for a in actions:
        print(json.dumps({"action": a.kind, "version": a.version, "path": str(a.path), "bytes": a.bytes}))
    freed = sum(a.bytes for a in actions) if args.dry_run else apply(actions)
    print(json.dumps({"run": args.run, "dry_run": args.dry_run, "actions": len(actions), "bytes": freed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
