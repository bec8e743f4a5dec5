"""A folder at a blob's address reads as missing and the next put of the bytes replaces it (never a lasting
IsADirectoryError), as blob/store.ts does."""

from __future__ import annotations

import hashlib

import pytest

from halo_learner.blobs import BlobNotFound, BlobStore


def test_a_folder_at_a_blob_address_is_replaced_by_the_next_put(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    data = b'{"batch":"of a run"}'
    ref = f"sha256:{hashlib.sha256(data).hexdigest()}.json"
    path = store.path_of(ref)
    (path / "inside").mkdir(parents=True)
    (path / "inside" / "x").write_text("left there")

    assert store.exists(ref) is False
    with pytest.raises(BlobNotFound, match="a folder is at its address"):
        store.get(ref)

    assert store.put(data, "json") == ref
    assert path.is_file() and store.get(ref) == data and store.exists(ref)
    assert [p.name for p in path.parent.iterdir()] == [path.name]
