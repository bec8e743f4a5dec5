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
