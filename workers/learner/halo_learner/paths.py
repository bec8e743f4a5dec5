"""Where things live on the shared filesystem, with the same defaults as the TypeScript side."""

from __future__ import annotations

import os
import re
from pathlib import Path

# workers/learner/halo_learner/paths.py -> repo root is three levels up.
REPO_ROOT = Path(__file__).resolve().parents[3]


def _under_repo(value: str) -> Path:
    # Relative settings mean "relative to the repo root", so the worker finds the same folders as the
    # TypeScript workers whatever directory it was started from.
    p = Path(value)
    return p if p.is_absolute() else REPO_ROOT / p


def halo_home() -> Path:
    return _under_repo(os.environ.get("HALO_HOME") or "runs")


def blob_root() -> Path:
    return halo_home() / "blobs"


def checkpoints_root() -> Path:
    return _under_repo(os.environ.get("HALO_CHECKPOINTS") or "checkpoints")


def models_cache() -> Path:
    return halo_home() / "models"


# A run id names a folder (checkpoints/<run_id>/): one path component that starts with a letter or digit, so
# "", ".", "..", ".hidden" and anything with a separator are refused. Same rule as the TypeScript configs
# (train.runId, mcts.runId), with room for derived ids.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)


def check_run_id(run_id: str) -> str:
    """The run id, if it is a safe single folder name; else ValueError."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"invalid run id {run_id!r}: letters, digits, . _ - starting with a letter or digit (max 200)")
    return run_id


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (the directory entry, not only the file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
