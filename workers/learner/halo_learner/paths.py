"""Where things live on the shared filesystem, with the same defaults as the TypeScript side."""

from __future__ import annotations

import os
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
