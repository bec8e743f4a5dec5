"""Adapter version folders are written durably and loaded only whole: files checked against the sha256 their
manifest records, a damaged folder treated as missing (fetched again from the object store, where there is one:
test_object_store.py; else a clear error)."""

from __future__ import annotations

import hashlib
import os

import pytest

from conftest import fake_version
from halo_learner import adapters


@pytest.fixture(autouse=True)
def _no_store(monkeypatch):
    monkeypatch.delenv("HALO_STORE", raising=False)


def test_a_whole_version_passes_and_is_hashed_once(tmp_path, monkeypatch):
    path = fake_version(tmp_path, "run-ok", 1)
    assert adapters.synced_version_dir("run-ok", 1, tmp_path) == path
    hashed = []
    monkeypatch.setattr(adapters, "_sha256", lambda f: hashed.append(f) or hashlib.sha256(f.read_bytes()).hexdigest())
    assert adapters.damage(path) is None and hashed == []  # checked already in this process, unchanged since
    # Retention removes the optimiser state after rewriting the manifest; a folder caught in between is whole.
    (path / adapters.OPTIMIZER_FILE).unlink()
    assert adapters.damage(path) is None


@pytest.mark.parametrize("damage", ["empty", "cut short", "zeros of the right length", "missing"])
def test_a_damaged_adapter_file_is_a_missing_version(tmp_path, damage):
    path = fake_version(tmp_path, "run-torn", 1, weights=b"w" * 1000)
    f = path / adapters.ADAPTER_FILE
    if damage == "missing":
        f.unlink()
    else:
        f.write_bytes({"empty": b"", "cut short": b"w" * 10, "zeros of the right length": bytes(1000)}[damage])
    assert adapters.damage(path)
    with pytest.raises(adapters.AdapterDamaged, match=r"run-torn/v1 .* is damaged: adapter_model\.safetensors"):
        adapters.synced_version_dir("run-torn", 1, tmp_path)
    # The learner's load path refuses it before touching the model, as a missing parent.
    with pytest.raises(adapters.ParentVersionMissing, match="damaged"):
        adapters.load_version(None, None, "run-torn", 1, tmp_path)


def test_a_torn_manifest_is_a_missing_version(tmp_path):
    path = fake_version(tmp_path, "run-m", 1)
    (path / adapters.MANIFEST_FILE).write_bytes(b"")
    with pytest.raises(adapters.AdapterDamaged, match="manifest.json is unreadable"):
        adapters.load_version(None, None, "run-m", 1, tmp_path)


def test_a_file_changed_after_it_was_checked_is_checked_again(tmp_path):
    path = fake_version(tmp_path, "run-c", 1, weights=b"w" * 1000)
    assert adapters.damage(path) is None
    (path / adapters.ADAPTER_FILE).write_bytes(b"x" * 1000)
    assert "does not match its sha256" in adapters.damage(path)


def test_write_manifest_is_durable(tmp_path, monkeypatch):
    path = fake_version(tmp_path, "run-w", 1)
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd)
    )
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("rename", str(a), str(b))) or real_replace(a, b))
    m = adapters.read_manifest(path)
    m["optimizer_pruned"] = True
    adapters.write_manifest(path, m)
    assert adapters.read_manifest(path)["optimizer_pruned"] is True
    i = next(i for i, e in enumerate(events) if e[0] == "rename")
    assert events[i][2] == str(path / adapters.MANIFEST_FILE)
    assert ("fsync", events[i][1]) in events[:i] and ("fsync", str(path)) in events[i + 1 :], events
    assert [p.name for p in path.iterdir() if p.name.startswith(".")] == []
