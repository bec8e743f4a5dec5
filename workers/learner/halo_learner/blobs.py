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
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from . import file_modes, objects, paths

# blob/store.ts's REFRESH_EVERY_MS: a reused object is at most this much older than its last put. `halo gc` adds it
# to its grace (at least 10 minutes), so it must never be longer than the TypeScript side's.
REFRESH_EVERY_S = 60.0

# blob/store.ts's WRITERS: records of the namespaces that write to a store, beside (never among) its blobs.
_WRITERS = "writers"

_REF = re.compile(r"^sha256:([0-9a-f]{64})\.([a-z0-9]{1,8})$")


class BlobNotFound(Exception):
    def __init__(self, ref: str, root: Path | str, why: str | None = None):
        super().__init__(f"blob {ref} not found under {root}" + (f" ({why})" if why else ""))
        self.ref = ref


class BadBlobRef(ValueError):
    pass


def _holds(path: Path, buf: bytes) -> bool:
    """Whether the file at `path` holds exactly `buf`."""
    try:
        if path.stat().st_size != len(buf):
            return False
        return path.read_bytes() == buf
    except OSError:
        return False


def _remove_folder_at(path: Path) -> None:
    """A folder where a blob file belongs would make every write of it fail (IsADirectoryError) for good: moved
    aside, then removed."""
    if path.is_symlink() or not path.is_dir():
        return
    aside = path.with_name(f"{path.name}.folder-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return  # another writer moved it first
    shutil.rmtree(aside, ignore_errors=True)


def _mkdirs(folder: Path) -> list[Path]:
    """mkdir -p; the folders it created, deepest first (their parents' entries are new)."""
    made, p = [], folder
    while not p.exists():
        made.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    file_modes.set_folders(made)
    return made


def write_durably(path: Path, data: bytes, new_folders: list[Path] = ()) -> None:
    """Write `data` to `path` so that after a power cut the name holds nothing or all of it: a temp file in the
    same folder, fsynced, renamed over `path`, then the folder fsynced (and the parents of `new_folders`, folders
    this write created)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, file_modes.FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    paths.fsync_dir(path.parent)
    for d in new_folders:
        paths.fsync_dir(d.parent)


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
        return self.path_of(ref).is_file()

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
            # that stored bytes are not sent again. Content-addressed keys may fall back to head-then-put on a
            # server without conditional writes: every writer writes the same bytes.
            there = len(buf) > (1 << 20) and self.s3.exists(key)
            if there or not self.s3.put_if_absent(key, buf, same_bytes_everywhere=True):
                self._refresh_object(key, buf)
            return ref
        path = self.path_of(ref)
        # Already there and whole: make it young again, so that `halo gc` does not sweep an old blob this process
        # has just reused and not yet named anywhere (the sweep re-checks the age right before removing). "Whole"
        # is the full comparison, as `get` checks the sha256: a file torn by a power cut (empty, cut short, zeros
        # of the right length) is written again, not only made young.
        if _holds(path, buf):
            try:
                os.utime(path)
                return ref
            except FileNotFoundError:
                pass
            except PermissionError:
                return ref  # another user's file; the bytes are there
        _remove_folder_at(path)
        made = _mkdirs(path.parent)
        # Readers never see a half-written file (write aside, then rename: atomic on POSIX), and after a power cut
        # the name is either absent or whole: the file is fsynced before the rename, its folder after it.
        try:
            write_durably(path, buf, made)
        except OSError:
            if _holds(path, buf):
                return ref
            raise
        return ref

    def _refresh_object(self, key: str, buf: bytes) -> None:
        now = time.monotonic()
        if now - self._refreshed.get(key, -REFRESH_EVERY_S) < REFRESH_EVERY_S:
            return
        if len(self._refreshed) > 100_000:
            self._refreshed.clear()
        # An object's put is all or nothing, so a damaged one (`get` refuses it) has another length, e.g. empty:
        # checked at most once per REFRESH_EVERY_S (or after a read found it damaged), and written again.
        size = self.s3.size(key)
        if size != len(buf):
            if size is not None:
                self.s3.delete(key)
            if self.s3.put_if_absent(key, buf, same_bytes_everywhere=True):
                self._refreshed[key] = now
                return
        self.s3.touch(key)
        self._refreshed[key] = now

    def record_writer(self, namespace: str, address: str | None = None, host: str | None = None) -> None:
        """As blob/store.ts recordWriter: the namespace whose workflows will name what this process writes, recorded
        in the store before it writes, so that `halo gc` refuses a sweep that does not read that namespace."""
        if not namespace:
            raise ValueError("record_writer: an empty namespace")
        plain = re.match(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$", namespace)
        name = f"{namespace}.json" if plain else f"hex-{namespace.encode().hex()[:200]}.json"
        body = {"namespace": namespace, "address": address, "host": host, "home": str(paths.halo_home())}
        data = (json.dumps({k: v for k, v in body.items() if v is not None}, separators=(",", ":")) + "\n").encode()
        if self.s3 is not None:
            self.s3.put_if_absent(self.s3.loc.key(_WRITERS, name), data, "application/json", same_bytes_everywhere=True)
            return
        path = Path(self.root) / _WRITERS / name
        if path.exists():
            return
        write_durably(path, data, _mkdirs(path.parent))

    def put_json(self, value: Any) -> str:
        # Compact separators match JSON.stringify, so the same value gets the same reference on both sides.
        return self.put(json.dumps(value, separators=(",", ":"), ensure_ascii=False), "json")

    def get(self, ref: str) -> bytes:
        """The bytes of `ref`, checked against it: bytes whose sha256 is not the address (a file torn by a power
        cut: empty or cut short) are BlobNotFound like a missing blob; the next put of the bytes repairs them."""
        if self.s3 is not None:
            key = self._key(ref)
            try:
                data = self.s3.get(key)
            except objects.ObjectNotFound:
                raise BlobNotFound(ref, self.root) from None
        else:
            path = self.path_of(ref)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise BlobNotFound(ref, self.root) from None
            except IsADirectoryError:
                # A folder at the address holds no blob: missing, and the next put of the bytes replaces it.
                raise BlobNotFound(ref, self.root, "a folder is at its address") from None
        if hashlib.sha256(data).hexdigest() != ref[7:71]:
            if self.s3 is not None:
                self._refreshed.pop(key, None)  # the next put of these bytes checks and repairs the object
            raise BlobNotFound(ref, self.root, f"damaged: {len(data)} bytes whose sha256 is not the address")
        return data

    def get_json(self, ref: str) -> Any:
        return json.loads(self.get(ref).decode("utf-8"))
