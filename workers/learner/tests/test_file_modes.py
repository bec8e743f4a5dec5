"""One file-mode policy for what the learner writes and the workers or vLLM read (file_modes.py): files 0640,
folders 0750, whatever the process's umask. In compose every service runs as one uid:gid; mkstemp's 0600 and
mkdtemp's 0700 would shut out any other uid of that group (an operator's, a vLLM run as another user)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from halo_learner import adapters
from halo_learner.blobs import BlobStore
from halo_learner.file_modes import DIR_MODE, FILE_MODE


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(params=[0o077, 0o022], ids=["umask-077", "umask-022"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_a_blob_and_its_folders_are_group_readable_whatever_the_umask(tmp_path, umask):
    store = BlobStore(tmp_path / "home" / "blobs")
    path = store.path_of(store.put(b"a screenshot", "png"))
    assert _mode(path) == FILE_MODE == 0o640
    assert _mode(path.parent) == DIR_MODE == 0o750
    assert _mode(tmp_path / "home" / "blobs") == DIR_MODE
    assert not list(path.parent.glob("*.tmp"))


def test_an_adapter_version_is_group_readable_whatever_the_umask(tmp_path, umask, policy):
    opt = torch.optim.AdamW(list(policy.trainable_parameters().values()), lr=1e-6)
    path, reused = adapters.save_version(policy, opt, "run-m", 1, 0, "grpo", {}, tmp_path / "ck", batch_ref="sha256:b")
    assert not reused
    assert _mode(path) == DIR_MODE and _mode(path.parent) == DIR_MODE
    files = sorted(path.iterdir())
    assert {f.name for f in files} >= {adapters.ADAPTER_FILE, adapters.CONFIG_FILE, adapters.MANIFEST_FILE}
    for f in files:
        assert _mode(f) == FILE_MODE, f"{f.name} is {oct(_mode(f))}"
    # The manifest is rewritten in place later (publishing, repairs): the new one keeps the mode.
    adapters.write_manifest(path, adapters.read_manifest(path))
    assert _mode(path / adapters.MANIFEST_FILE) == FILE_MODE
