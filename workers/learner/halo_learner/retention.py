"""Adapter retention: what of checkpoints/<run_id>/v<N>/ to keep.

For the 8B an adapter is ~0.17 GiB and its AdamW moments ~0.35 GiB, so 200 whole versions are ~100 GiB.
Rules, per run:
  * the last `keep_last` versions stay whole (the newest is the parent of the next update, and a few more
    let a run resume from a slightly older point);
  * an older version loses its optimiser state (weights, config and manifest stay: vLLM can still serve it,
    an evaluation can still load it); the learner applies this rule by itself after every update;
  * an older version is deleted only when the caller asks for deletion (`halo gc`) and it is neither a
    multiple of `keep_every` nor in `needed` (versions a running run, an evaluation or a served model uses);
  * a version in `needed` is never touched, nor is any version from `needed_from` up (an open training run's
    current adapter, its parent and what it writes next: `halo gc --run` finds them in Temporal);
  * `keep_last` is at least 1: with 0 the newest version, the next update's parent, would lose the optimiser
    state a restarted learner resumes from (or, with deletion, the version itself). It is refused, never
    taken to mean "keep nothing" (HALO_KEEP_VERSIONS=0 included).

With HALO_STORE=s3://… the object store's copies (<prefix>/checkpoints/<run_id>/v<N>/) follow the same rule: a
version deleted here is deleted there too (its manifest first, so that a reader never finds a manifest without its
files), and versions only the store holds (written on another host) count and are deleted alike.

    python -m halo_learner.retention --run <run_id> [--keep-last 3] [--keep-every 10] [--need 7 --need 12]
                                     [--need-from 11] [--delete] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import adapters
from .adapters import MANIFEST_FILE, OPTIMIZER_FILE, read_manifest, version_dir, write_manifest

log = logging.getLogger(__name__)
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


def remote_versions(store, run_id: str) -> set[int]:
    """Versions of the run committed in the object store (a manifest under <run_id>/v<N>/)."""
    prefix = store.loc.key(run_id) + "/"
    out = set()
    for key in store.list(prefix):
        parts = key[len(prefix) :].split("/")
        if len(parts) == 2 and parts[1] == MANIFEST_FILE and parts[0][:1] == "v" and parts[0][1:].isdigit():
            out.add(int(parts[0][1:]))
    return out


def _delete_remote(store, run_id: str, version: int) -> None:
    prefix = store.loc.key(run_id, f"v{version}") + "/"
    store.delete(prefix + MANIFEST_FILE)  # first: without it the version is absent, never half there
    for key in store.list(prefix):
        store.delete(key)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_keep_last(keep_last: int, what: str = "keep_last") -> int:
    """`keep_last` if it is 1 or more, else a ValueError that says why."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(
            f"{what} must be 1 or more (got {keep_last!r}): the newest version is the next update's "
            "parent and holds the optimiser state a restarted learner resumes from"
        )
    return keep_last


def keep_last_from_env(env=None) -> int:
    """HALO_KEEP_VERSIONS (default DEFAULT_KEEP_LAST), checked: the learner's setting for `prune_after_update`."""
    raw = (os.environ if env is None else env).get("HALO_KEEP_VERSIONS", str(DEFAULT_KEEP_LAST))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"HALO_KEEP_VERSIONS must be a whole number, 1 or more (got {raw!r})") from None
    return check_keep_last(value, "HALO_KEEP_VERSIONS")


def plan(
    run_dir: Path,
    keep_last: int = DEFAULT_KEEP_LAST,
    keep_every: int = DEFAULT_KEEP_EVERY,
    needed: set[int] | frozenset[int] = frozenset(),
    delete: bool = False,
    needed_from: int | None = None,
    store=None,
) -> list[Action]:
    """What retention would do to one run's folder (and, with `store`, to its copies there); nothing is changed.
    keep_last < 1 is a ValueError."""
    check_keep_last(keep_last)
    found = versions(run_dir)
    remote = remote_versions(store, run_dir.name) if store is not None else set()
    every = sorted(set(found) | remote)
    whole = set(every[-keep_last:])
    actions = []
    for v in every:
        path = found.get(v, run_dir / f"v{v}")
        if v in whole or v in needed or (needed_from is not None and v >= needed_from):
            continue
        milestone = keep_every > 0 and v % keep_every == 0
        if delete and not milestone:
            actions.append(Action("delete", v, path, _size(path) if v in found else 0))
        elif v in found and (path / OPTIMIZER_FILE).exists():
            actions.append(Action("strip-optimizer", v, path, (path / OPTIMIZER_FILE).stat().st_size))
    return actions


def apply(actions: list[Action], store=None) -> int:
    """Carry out `plan`'s actions; returns the bytes freed. A version whose manifest cannot be read (torn by a
    crash, edited by hand) is left as it is and named in the log; the others are still done."""
    freed = 0
    for a in actions:
        if a.kind == "delete":
            if store is not None:
                _delete_remote(store, a.path.parent.name, a.version)
            if a.path.exists():
                # Rename first so a half-deleted folder never looks like a complete version.
                doomed = a.path.with_name(f".{a.path.name}.deleting")
                os.rename(a.path, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
        else:
            try:
                _strip_optimizer(a.path)
            except (ValueError, KeyError, TypeError) as e:
                log.warning(
                    "retention: v%d at %s keeps its optimiser state: %s is unreadable (%s: %s)",
                    a.version,
                    a.path,
                    MANIFEST_FILE,
                    e.__class__.__name__,
                    e,
                )
                continue
        freed += a.bytes
    return freed


def _strip_optimizer(path: Path) -> None:
    m = read_manifest(path)
    if not isinstance(m, dict) or not isinstance(m.get("files"), dict):
        raise ValueError("it has no files object")
    m["files"].pop(OPTIMIZER_FILE, None)
    m["optimizer_pruned"] = True
    write_manifest(path, m)  # manifest first (and durably): it never lists a file that is gone
    (path / OPTIMIZER_FILE).unlink(missing_ok=True)


def prune_after_update(root: Path | None, run_id: str, keep_last: int = DEFAULT_KEEP_LAST) -> int:
    """The learner's own, safe part of retention: optimiser state of versions older than the last K (K ≥ 1)."""
    check_keep_last(keep_last, "HALO_KEEP_VERSIONS (keep_last)")
    run_dir = version_dir(run_id, 0, root).parent
    return apply(plan(run_dir, keep_last=keep_last, keep_every=0, delete=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m halo_learner.retention", description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--root", type=Path, default=None, help="checkpoints folder (default HALO_CHECKPOINTS)")
    ap.add_argument("--keep-last", type=int, default=DEFAULT_KEEP_LAST)
    ap.add_argument("--keep-every", type=int, default=DEFAULT_KEEP_EVERY)
    ap.add_argument("--need", type=int, action="append", default=[])
    ap.add_argument(
        "--need-from",
        type=int,
        default=None,
        help="every version from this one up is needed (an open training run's adapter and its parent)",
    )
    ap.add_argument("--delete", action="store_true", help="delete old versions, not only their optimiser state")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    if args.keep_last < 1:
        ap.error(
            f"--keep-last {args.keep_last}: 1 or more (the newest version is the next update's parent and holds "
            "the optimiser state a restarted learner resumes from)"
        )
    run_dir = version_dir(args.run, 0, args.root).parent
    store = adapters.remote_store()
    actions = plan(
        run_dir, args.keep_last, args.keep_every, set(args.need), args.delete, needed_from=args.need_from, store=store
    )
    for a in actions:
        print(json.dumps({"action": a.kind, "version": a.version, "path": str(a.path), "bytes": a.bytes}))
    freed = sum(a.bytes for a in actions) if args.dry_run else apply(actions, store)
    print(json.dumps({"run": args.run, "dry_run": args.dry_run, "actions": len(actions), "bytes": freed}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
