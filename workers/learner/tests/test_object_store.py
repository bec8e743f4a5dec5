"""Blob store contract on both backends (folder, S3-compatible bucket on moto's server), and adapter versions
published once to the bucket and fetched into a local cache."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import fake_version
from halo_learner import adapters, objects
from halo_learner import blobs as blobs_module
from halo_learner.blobs import BadBlobRef, BlobNotFound, BlobStore

MOTO = Path(sys.executable).parent / "moto_server"
PNG = b"\x89PNG a screenshot"


@pytest.fixture(scope="module")
def moto():
    if not MOTO.exists():
        pytest.fail(f"{MOTO} is missing: run ./launch.sh setup (it installs moto[server])")
    proc = subprocess.Popen(
        [str(MOTO), "-H", "127.0.0.1", "-p", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        port = None
        for line in proc.stdout:
            m = re.search(r"Running on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "moto_server did not start"
        # Keep draining its request log.
        import threading

        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        env = {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ACCESS_KEY_ID": "halo-test",
            "AWS_SECRET_ACCESS_KEY": "halo-test-secret",
            "AWS_REGION": "us-east-1",
        }
        bucket = f"halo-py-{uuid.uuid4().hex[:8]}"
        objects.client_from_env(env).create_bucket(Bucket=bucket)
        yield env, bucket
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def s3_env(moto, monkeypatch):
    env, bucket = moto
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    for k, v in {**env, "HALO_STORE": f"s3://{bucket}/{prefix}"}.items():
        monkeypatch.setenv(k, v)
    return bucket, prefix


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path):
    if request.param == "folder":
        return BlobStore(tmp_path / "blobs")
    request.getfixturevalue("s3_env")
    return BlobStore()


def test_put_get_exists(store):
    ref = store.put(PNG, "png")
    assert ref == f"sha256:{hashlib.sha256(PNG).hexdigest()}.png"
    assert store.exists(ref) and store.get(ref) == PNG
    assert store.put(PNG, "png") == ref
    assert store.get_json(store.put_json({"a": [1, None]})) == {"a": [1, None]}
    assert not store.exists("sha256:" + "c" * 64 + ".png")


def test_concurrent_identical_puts(store):
    data = PNG + b" identical"
    with ThreadPoolExecutor(16) as pool:
        refs = list(pool.map(lambda _: store.put(data, "png"), range(200)))
    assert set(refs) == {f"sha256:{hashlib.sha256(data).hexdigest()}.png"}
    assert store.get(refs[0]) == data
    if store.s3 is None:
        assert not list(Path(store.root).rglob("*.tmp"))


def _last_write(store, ref) -> float:
    if store.s3 is None:
        return store.path_of(ref).stat().st_mtime
    head = store.s3.client.head_object(Bucket=store.s3.loc.bucket, Key=store._key(ref))
    return head["LastModified"].timestamp()


def test_a_reused_blob_is_made_young_again(store):
    """`halo gc` sweeps blobs older than its grace period that nothing names; a put of bytes already stored is a
    use, so it must refresh the age, or a blob a learner has just reused could go before it is recorded."""
    ref = store.put(PNG + b" reused", "png")
    if store.s3 is None:
        old = time.time() - 7200
        os.utime(store.path_of(ref), (old, old))
    else:
        time.sleep(1.1)  # LastModified has one-second resolution
    before = _last_write(store, ref)
    assert store.put(PNG + b" reused", "png") == ref
    after = _last_write(store, ref)
    assert after > before and after > time.time() - 60
    assert store.get(ref) == PNG + b" reused"


def test_a_reuse_minutes_after_the_last_refresh_refreshes_again(store, monkeypatch):
    """The refresh of a reused object is throttled per process; `halo gc` allows for the throttle's period on top of
    its grace (at least 10 minutes), so a reuse 9 min 58 s after the last refresh must refresh again, or a sweep
    seconds later finds the blob older than its grace."""
    data = PNG + b" reused by every fork"
    ref = store.put(data, "png")
    time.sleep(1.1)
    store.put(data, "png")
    first = _last_write(store, ref)
    time.sleep(1.1)
    real = time.monotonic
    monkeypatch.setattr(blobs_module.time, "monotonic", lambda: real() + 598.0)
    store.put(data, "png")
    assert _last_write(store, ref) > first, "a reuse was not recorded in the blob's age"


def test_writers_are_recorded_beside_the_blobs(store):
    """A learner records its namespace where `halo gc` looks for every namespace that writes to the store."""
    store.record_writer("team-b", "temporal:7233", "gpu-1")
    store.record_writer("team-b", "elsewhere:7233", "gpu-2")  # the first record stays
    if store.s3 is None:
        text = (Path(store.root) / "writers" / "team-b.json").read_text()
    else:
        text = store.s3.get(store.s3.loc.key("writers", "team-b.json")).decode()
    assert json.loads(text)["namespace"] == "team-b" and json.loads(text)["address"] == "temporal:7233"
    ref = store.put(PNG, "png")
    assert store.get(ref) == PNG


def test_missing_and_bad_refs(store):
    with pytest.raises(BlobNotFound, match="b" * 64):
        store.get("sha256:" + "b" * 64 + ".json")
    for bad in ["../etc/passwd", "sha256:" + "a" * 64 + ".png/../x", "sha256:" + "A" * 64 + ".png"]:
        with pytest.raises(BadBlobRef):
            store.get(bad)


def test_keys_cannot_leave_the_prefix():
    loc = objects.parse_store_url("s3://my-bucket/team/halo/")
    assert (loc.bucket, loc.prefix) == ("my-bucket", "team/halo")
    assert loc.key("checkpoints", "run-1", "v2") == "team/halo/checkpoints/run-1/v2"
    for bad in ["s3://my-bucket/a/../b", "s3://my-bucket/./a", "s3://My_Bucket/a", "/var/blobs", "http://x/y"]:
        with pytest.raises(ValueError):
            objects.parse_store_url(bad)
    for bad in ["..", ".", "a/b", "", "%2e"]:
        with pytest.raises(objects.BadKey):
            loc.key("checkpoints", bad)


def test_adapter_versions_are_published_once_and_fetched(s3_env, tmp_path):
    bucket, prefix = s3_env
    gpu_a, gpu_b = tmp_path / "a", tmp_path / "b"
    mine = fake_version(gpu_a, "run-1", 1, b"weights of A")
    assert adapters.publish_version(mine, "run-1", 1)
    assert adapters.publish_version(mine, "run-1", 1), "publishing the same folder again is a no-op"
    # Another host has no copy: the path it needs is fetched, checked against the manifest's sha256.
    fetched = adapters.synced_version_dir("run-1", 1, gpu_b)
    assert (fetched / adapters.ADAPTER_FILE).read_bytes() == b"weights of A"
    assert adapters.read_manifest(fetched)["metrics"] == {"loss": 0.5}
    # A learner that trained v1 too (a handed-over update) loses: its folder becomes the committed one.
    loser = fake_version(tmp_path / "c", "run-1", 1, b"weights of C")
    assert adapters.publish_version(loser, "run-1", 1) is False
    assert (loser / adapters.ADAPTER_FILE).read_bytes() == b"weights of A"
    # A version written locally but never uploaded (killed in between) is published when next needed.
    fake_version(gpu_a, "run-1", 2, b"v2")
    adapters.synced_version_dir("run-1", 2, gpu_a)
    keys = objects.S3Objects(objects.store_location()).list(prefix + "/")
    manifests = sorted(k for k in keys if k.endswith("/manifest.json"))
    assert manifests == [f"{prefix}/checkpoints/run-1/v1/manifest.json", f"{prefix}/checkpoints/run-1/v2/manifest.json"]
    assert not adapters.fetch_version("run-1", 9, gpu_b)
    with pytest.raises(ValueError):  # objects.BadKey is one too
        adapters.fetch_version("..", 1, gpu_b)


def test_save_version_publishes(s3_env, tmp_path, policy):
    import torch

    opt = torch.optim.AdamW(list(policy.trainable_parameters().values()), lr=1e-6)
    path, reused = adapters.save_version(
        policy, opt, "run-s", 1, 0, "grpo", {"loss": 1.0}, tmp_path / "ck", batch_ref="sha256:b"
    )
    assert not reused
    other = adapters.synced_version_dir("run-s", 1, tmp_path / "elsewhere")
    for name in (adapters.ADAPTER_FILE, adapters.CONFIG_FILE):
        assert (other / name).read_bytes() == (path / name).read_bytes()
    # On a host with no copy, save_version finds the committed version instead of writing another.
    again, reused = adapters.save_version(
        policy, opt, "run-s", 1, 0, "grpo", {}, tmp_path / "third", batch_ref="sha256:b"
    )
    assert reused and (again / adapters.ADAPTER_FILE).exists()


def test_a_torn_blob_reads_as_missing_and_a_put_repairs_it(store):
    data = PNG + b" torn" * 100
    ref = store.put(data, "png")
    for torn in (b"", data[:10]):
        if store.s3 is None:
            store.path_of(ref).write_bytes(torn)
        else:
            store.s3.client.put_object(Bucket=store.s3.loc.bucket, Key=store._key(ref), Body=torn)
        with pytest.raises(BlobNotFound, match="damaged"):
            store.get(ref)
        # Another process (a fresh handle) repairs it with a put of the bytes, and so does the handle that read it.
        fixer = BlobStore(store.root) if store.s3 is None else BlobStore() if torn == b"" else store
        assert fixer.put(data, "png") == ref
        assert store.get(ref) == data


class _NoConditionalWrites:
    """An S3 client for a server that refuses If-None-Match (501 NotImplemented), recording every put."""

    def __init__(self):
        self.objects: dict[str, bytes] = {}
        self.puts: list[tuple[str, bool]] = []

    def _error(self, status, code, op):
        from botocore.exceptions import ClientError

        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, op)

    def put_object(self, Bucket, Key, Body, IfNoneMatch=None, **_):
        self.puts.append((Key, IfNoneMatch is not None))
        if IfNoneMatch is not None:
            raise self._error(501, "NotImplemented", "PutObject")
        self.objects[Key] = Body

    def head_object(self, Bucket, Key):
        if Key not in self.objects:
            raise self._error(404, "404", "HeadObject")
        return {"ContentLength": len(self.objects[Key])}

    def get_object(self, Bucket, Key):
        import io

        if Key not in self.objects:
            raise self._error(404, "NoSuchKey", "GetObject")
        return {"Body": io.BytesIO(self.objects[Key])}


def test_a_commit_is_conditional_or_refused(tmp_path):
    """A manifest commits an adapter version: two learners must never both commit one, so on a server without
    conditional writes it is refused with a clear error, never head-then-put. Content-addressed keys (blobs,
    adapter files) may still use head-then-put there: every writer writes the same bytes."""
    client = _NoConditionalWrites()
    store = objects.S3Objects(objects.Location("halo-bucket", "team/checkpoints"), client)
    with pytest.raises(objects.ConditionalPutUnsupported, match="If-None-Match"):
        store.put_if_absent("team/checkpoints/run-1/v1/manifest.json", b"{}")
    assert client.puts == [("team/checkpoints/run-1/v1/manifest.json", True)]
    assert store.put_if_absent("team/blobs/ab/cd.png", b"png", same_bytes_everywhere=True)
    assert not store.put_if_absent("team/blobs/ab/cd.png", b"png", same_bytes_everywhere=True)
    with pytest.raises(objects.ConditionalPutUnsupported):  # still refused once the server is known
        store.put_if_absent("team/checkpoints/run-1/v1/manifest.json", b"{}")
    # publish_version uploads the files, then refuses to commit: no manifest is written.
    path = fake_version(tmp_path, "run-1", 1, b"weights")
    with pytest.raises(objects.ConditionalPutUnsupported):
        adapters.publish_version(path, "run-1", 1, store)
    assert not any(k.endswith("manifest.json") for k in client.objects)
    assert any(k.endswith("-" + adapters.ADAPTER_FILE) for k in client.objects)


def test_the_stand_in_server_honours_if_none_match(moto):
    """moto (5.2.5) answers a second `If-None-Match: *` put of a key with 412: the commit race is decided there."""
    env, bucket = moto
    store = objects.S3Objects(objects.Location(bucket, f"c-{uuid.uuid4().hex[:8]}"), objects.client_from_env(env))
    key = store.loc.key("manifest.json")
    assert store.put_if_absent(key, b"first") is True
    assert store.put_if_absent(key, b"second") is False
    assert store.get(key) == b"first" and store.conditional


def test_a_damaged_fetched_copy_is_fetched_again(s3_env, tmp_path, monkeypatch):
    path = fake_version(tmp_path / "a", "run-d", 1, b"weights " * 100)
    assert adapters.publish_version(path, "run-d", 1)
    fsynced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsynced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    copy = adapters.synced_version_dir("run-d", 1, tmp_path / "b")
    # Every fetched file, and the folder, fsynced before the rename; the run folder after it.
    fetched = [Path(p) for p in fsynced if ".v1.tmp-fetch-" in p]
    assert {p.name for p in fetched} >= {adapters.ADAPTER_FILE, adapters.CONFIG_FILE, adapters.MANIFEST_FILE}, fsynced
    assert any(p.name.startswith(".v1.tmp-fetch-") for p in fetched) and str(copy.parent) in fsynced
    (copy / adapters.ADAPTER_FILE).write_bytes(b"")  # torn by a power cut
    again = adapters.synced_version_dir("run-d", 1, tmp_path / "b")
    assert again == copy and (copy / adapters.ADAPTER_FILE).read_bytes() == b"weights " * 100
    # A local version never published and damaged is not published (its sha256 would name the wrong bytes).
    mine = fake_version(tmp_path / "a", "run-d", 2, b"v2")
    (mine / adapters.ADAPTER_FILE).write_bytes(b"v")
    with pytest.raises(adapters.AdapterDamaged):
        adapters.synced_version_dir("run-d", 2, tmp_path / "a")


def test_a_fetched_copy_of_a_version_is_group_readable(s3_env, tmp_path):
    """A copy fetched from the bucket follows the file-mode policy as a version written here does (file_modes.py):
    mkdtemp's 0700 would hide it from the workers and vLLM under another uid of the group."""
    adapters.publish_version(fake_version(tmp_path / "a", "run-m", 1, b"weights"), "run-m", 1)
    old = os.umask(0o077)
    try:
        fetched = adapters.fetch_version("run-m", 1, tmp_path / "b")
    finally:
        os.umask(old)
    assert fetched is not None
    assert oct(fetched.stat().st_mode & 0o777) == "0o750"
    for f in fetched.iterdir():
        assert oct(f.stat().st_mode & 0o777) == "0o640", f.name
