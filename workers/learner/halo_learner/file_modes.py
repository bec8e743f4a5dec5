"""The stack's one file-mode policy for what one process writes and another reads (blob/file-modes.ts): blobs,
adapter versions and their copies fetched from the object store are readable by the writer and its group,
nobody else. Compose runs every service that touches ./runs or ./checkpoints as one uid:gid
(docs/operations.md, "File modes"). Set with chmod after creation, so the umask cannot narrow it (mkstemp's 0600
and mkdtemp's 0700 would lock a second uid of the group out) or widen it."""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o640
DIR_MODE = 0o750


def set_tree(folder: Path) -> None:
    """`folder` and everything under it (links left alone) to the policy's modes."""
    for dirpath, _dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, DIR_MODE)
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                os.chmod(p, FILE_MODE)


def set_folders(folders: list[Path]) -> None:
    """Folders this process just created (mkdir's mode is narrowed by the umask)."""
    for d in folders:
        os.chmod(d, DIR_MODE)
