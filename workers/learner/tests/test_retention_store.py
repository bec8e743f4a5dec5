"""Retention with an object store (HALO_STORE): the store's copies of adapter versions are pruned with the local ones,
and versions only the store holds (written on another host) count and go alike."""

from __future__ import annotations

from conftest import fake_version
from halo_learner import adapters, objects, retention
from test_object_store import moto, s3_env  # noqa: F401 (fixtures)


def _remote_manifests(prefix: str, run: str) -> list[str]:
    keys = objects.S3Objects(objects.store_location()).list(f"{prefix}/checkpoints/{run}/")
    return sorted(k.split("/")[-2] for k in keys if k.endswith("/manifest.json"))


def _remote_keys(prefix: str, run: str, version: int) -> list[str]:
    return objects.S3Objects(objects.store_location()).list(f"{prefix}/checkpoints/{run}/v{version}/")


def test_deleted_versions_leave_the_object_store_too(request, tmp_path):
    _, prefix = request.getfixturevalue("s3_env")
    here, other = tmp_path / "here", tmp_path / "other-host"
    for v in (1, 2, 3, 4):
        adapters.publish_version(fake_version(here, "r", v, f"w{v}".encode()), "r", v)
    adapters.publish_version(fake_version(other, "r", 5, b"w5"), "r", 5)  # only the store and another host have v5
    assert _remote_manifests(prefix, "r") == ["v1", "v2", "v3", "v4", "v5"]

    assert (
        retention.main(
            ["--run", "r", "--root", str(here), "--keep-last", "1", "--keep-every", "0", "--need", "2", "--delete"]
        )
        == 0
    )
    # v5 is the newest of the run wherever it is, v2 is needed: both stay, in the store and here.
    assert _remote_manifests(prefix, "r") == ["v2", "v5"]
    for v in (1, 3, 4):
        assert _remote_keys(prefix, "r", v) == [], f"v{v}'s files are still in the store"
        assert not (here / "r" / f"v{v}").exists()
    assert (here / "r" / "v2").exists()
    # What is left is whole: another host fetches v2 and v5 as before.
    assert adapters.synced_version_dir("r", 5, tmp_path / "third").exists()
    assert adapters.damage(adapters.synced_version_dir("r", 2, tmp_path / "third")) is None
