"""Content-addressed blob store, byte-compatible with blob/store.ts.

A reference is `sha256:<64 hex>.<ext>`; the file lives at `<root>/<hex[:2]>/<hex[2:]>.<ext>`, where the root
is a folder (default `<HALO_HOME>/blobs`) or, with HALO_STORE=s3://bucket/prefix, the key prefix `<prefix>/blobs`
of that bucket (objects.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from . import objects, paths

# blob/store.ts's REFRESH_EVERY_MS: a reused blob is at most this much older than its last use (gc's grace is an hour).
REFRESH_EVERY_S = 600.0

_REF = re.compile(r"^sha256:([0-9a-f]{64})\.([a-z0-9]{1,8})$")


class BlobNotFound(Exception):
    def __init__(self, ref: str, root: Path | str):
        super().__init__(f"blob {ref} not found under {root}")
        self.ref = ref


class BadBlobRef(ValueError):
    pass


class BlobStore:
    def __init__(self, root: str | os.PathLike | None = None, s3: "objects.S3Objects | None" = None):
        if root is None and s3 is None:
            loc = objects.store_location()
            if loc is not None:
                s3 = objects.S3Objects(loc.child("blobs"))
        elif isinstance(root, str) and root.startswith("s3://"):
            s3 = objects.S3Objects(objects.parse_store_url(root, "blob store"))
        self.s3 = s3
        # Object-store keys this process made young again, and when: one self-copy per key per REFRESH_EVERY_S,
        # as blob/s3.ts does, so a hot blob (the same screenshot in every fork) costs one request, not one a put.
        self._refreshed: dict[str, float] = {}
        self.root = s3.where() if s3 is not None else (Path(root) if root is not None else paths.blob_root())

    def _key(self, ref: str) -> str:
        m = _REF.match(ref)
        if not m:
            raise BadBlobRef(f"not a blob reference: {ref!r}")
        return self.s3.loc.key(m.group(1)[:2], f"{m.group(1)[2:]}.{m.group(2)}")

    def exists(self, ref: str) -> bool:
        if self.s3 is not None:
            return self.s3.exists(self._key(ref))
        return self.path_of(ref).exists()

    def path_of(self, ref: str) -> Path:
        if self.s3 is not None:
            raise ValueError(f"blob store {self.root} is not a folder: no path for {ref}")
        m = _REF.match(ref)
        if not m:
            raise BadBlobRef(f"not a blob reference: {ref!r}")
        hex_, ext = m.group(1), m.group(2)
        return self.root / hex_[:2] / f"{hex_[2:]}.{ext}"

    def put(self, data: bytes | str, ext: str) -> str:
        buf = data.encode() if isinstance(data, str) else data
        ref = f"sha256:{hashlib.sha256(buf).hexdigest()}.{ext}"
        if self.s3 is not None:
            key = self._key(ref)
            # A conditional put checks existence in the same round trip; a large object is looked up first so
            # that stored bytes are not sent again. An existing object holds these bytes (content-addressed).
            there = len(buf) > (1 << 20) and self.s3.exists(key)
            if there or not self.s3.put_if_absent(key, buf):
                self._refresh_object(key)
            return ref
        path = self.path_of(ref)
        try:
            # Already there: make it young again, so that `halo gc` does not sweep an old blob this process has
            # just reused and not yet named anywhere (the sweep re-checks the age right before removing).
            os.utime(path)
            return ref
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        # Readers must never see a half-written file, so write aside and rename (atomic on POSIX).
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buf)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return ref

    def _refresh_object(self, key: str) -> None:
        now = time.monotonic()
        if now - self._refreshed.get(key, -REFRESH_EVERY_S) < REFRESH_EVERY_S:
            return
        if len(self._refreshed) > 100_000:
            self._refreshed.clear()
        self.s3.touch(key)
        self._refreshed[key] = now

    def put_json(self, value: Any) -> str:
        # Compact separators match JSON.stringify, so the same value gets the same reference on both sides.
        return self.put(json.dumps(value, separators=(",", ":"), ensure_ascii=False), "json")

    def get(self, ref: str) -> bytes:
        if self.s3 is not None:
            try:
                return self.s3.get(self._key(ref))
            except objects.ObjectNotFound:
                raise BlobNotFound(ref, self.root) from None
        path = self.path_of(ref)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(ref, self.root) from None

    def get_json(self, ref: str) -> Any:
        return json.loads(self.get(ref).decode("utf-8"))
