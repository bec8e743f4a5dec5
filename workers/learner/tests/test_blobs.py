"""The blob store is byte-compatible with blob/store.ts."""

from __future__ import annotations

import hashlib

import pytest

from halo_learner.blobs import BadBlobRef, BlobNotFound, BlobStore


def test_layout_and_round_trip(tmp_path):
    store = BlobStore(tmp_path)
    data = b"\x89PNG fake bytes"
    ref = store.put(data, "png")
    hex_ = hashlib.sha256(data).hexdigest()
    assert ref == f"sha256:{hex_}.png"
    assert (tmp_path / hex_[:2] / f"{hex_[2:]}.png").read_bytes() == data
    assert store.get(ref) == data
    assert store.put(data, "png") == ref
    assert not list(tmp_path.rglob("*.tmp"))


def test_json_matches_json_stringify(tmp_path):
    store = BlobStore(tmp_path)
    value = {"items": [{"a": 1, "b": "é"}], "max_completion_len": None}
    ref = store.put_json(value)
    # JSON.stringify: no spaces, UTF-8, key order preserved.
    expected = '{"items":[{"a":1,"b":"é"}],"max_completion_len":null}'.encode()
    assert ref == f"sha256:{hashlib.sha256(expected).hexdigest()}.json"
    assert store.get_json(ref) == value


def test_errors(tmp_path):
    store = BlobStore(tmp_path)
    with pytest.raises(BlobNotFound, match="sha256:" + "b" * 64):
        store.get("sha256:" + "b" * 64 + ".json")
    with pytest.raises(BadBlobRef):
        store.get("../etc/passwd")


@pytest.mark.parametrize("damage", ["empty", "cut short", "zeros of the right length"])
def test_a_torn_blob_reads_as_missing_and_a_put_repairs_it(tmp_path, damage):
    """After a power cut a renamed-but-unsynced file can be empty, short or zero-filled at its content address:
    `get` must not return it, and a later put of the same bytes must write them again (not only refresh the age)."""
    import os
    import time

    store = BlobStore(tmp_path)
    data = b"\x89PNG " + bytes(range(256)) * 40
    ref = store.put(data, "png")
    path = store.path_of(ref)
    path.write_bytes({"empty": b"", "cut short": data[:100], "zeros of the right length": bytes(len(data))}[damage])
    old = time.time() - 7200
    os.utime(path, (old, old))
    with pytest.raises(BlobNotFound, match="damaged"):
        store.get(ref)
    with pytest.raises(BlobNotFound):
        BlobStore(tmp_path).get_json(ref)
    assert store.put(data, "png") == ref
    assert store.get(ref) == data and path.read_bytes() == data
    assert path.stat().st_mtime > time.time() - 60
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_new_blob_is_fsynced_before_and_after_its_rename(tmp_path, monkeypatch):
    import os

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store = BlobStore(tmp_path / "blobs")
    ref = store.put(b"bytes to keep", "txt")
    path = store.path_of(ref)
    i = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2] == str(path))
    tmp = events[i][1]
    assert ("fsync", tmp) in events[:i], events  # the file's bytes before its name
    after = [e[1] for e in events[i + 1 :] if e[0] == "fsync"]
    assert str(path.parent) in after, events  # the rename itself
    assert str(tmp_path / "blobs") in after and str(tmp_path) in after, events  # the new folders' entries
    events.clear()
    assert store.put(b"bytes to keep", "txt") == ref
    assert events == []  # bytes already there and whole: nothing written
