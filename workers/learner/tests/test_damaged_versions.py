"""A damaged adapter version never stops a run: a torn manifest of an old version leaves pruning of the others going
and the update committed; a damaged copy of the version being written is quarantined and written again, not
reported as reused."""

from __future__ import annotations

import logging
import random

import pytest

from conftest import fake_version, messages, png_ref, tokens_ref
from halo_learner import adapters, retention
from halo_learner.learner import Learner, Settings
from halo_learner.memory import OomHints
from halo_learner.payloads import UpdatePolicyInput


@pytest.fixture(autouse=True)
def _no_store(monkeypatch):
    monkeypatch.delenv("HALO_STORE", raising=False)


def _learner(policy, blobs, tmp_path, keep_last=2) -> Learner:
    return Learner(
        policy,
        blobs=blobs,
        checkpoints=tmp_path / "ck",
        settings=Settings(micro_batch=4, keep_last=keep_last),
        oom_hints=OomHints(tmp_path / "h.json"),
    )


def _batch(blobs, seed: int) -> str:
    m = messages(png_ref(blobs, 64, 64, 3), "Goal: y")
    rnd = random.Random(seed)
    return blobs.put_json(
        {
            "items": [
                {
                    "prompt": m,
                    "completion": "",
                    "advantage": a,
                    "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(3)]),
                }
                for a in (1.0, -1.0)
            ],
            "max_completion_len": 4,
        }
    )


def _update(learner, run_id, v, ref):
    return learner.update_policy(
        UpdatePolicyInput(run_id=run_id, version=v, batch_ref=ref, hyperparameters={"learning_rate": 1e-3})
    )


TORN = {"empty": b"", "cut short": b'{"version": 1, "fil', "not an object": b"[1, 2]", "no files": b'{"version": 1}'}


@pytest.mark.parametrize("torn", list(TORN))
def test_retention_skips_a_version_whose_manifest_is_torn_and_prunes_the_rest(tmp_path, torn, caplog):
    for v in (1, 2, 3, 4):
        fake_version(tmp_path, "r", v)
    (tmp_path / "r" / "v1" / adapters.MANIFEST_FILE).write_bytes(TORN[torn])
    with caplog.at_level(logging.WARNING, logger="halo_learner.retention"):
        freed = retention.prune_after_update(tmp_path, "r", keep_last=1)
    run = tmp_path / "r"
    assert [(run / f"v{v}" / adapters.OPTIMIZER_FILE).exists() for v in (1, 2, 3, 4)] == [True, False, False, True]
    assert freed == 2 * len(b"moments")
    assert str(run / "v1") in caplog.text and "unreadable" in caplog.text


def test_a_torn_manifest_of_an_old_version_does_not_break_later_updates(policy, blobs, tmp_path):
    learner = _learner(policy, blobs, tmp_path, keep_last=2)
    run = tmp_path / "ck" / "torn"
    for v in (1, 2):
        _update(learner, "torn", v, _batch(blobs, v))
    (run / "v1" / adapters.MANIFEST_FILE).write_bytes(b'{"run_id": "torn", "files": {"adapter_mo')
    for v in (3, 4):
        out = _update(learner, "torn", v, _batch(blobs, v))
        assert out.reused is False and out.version == v
    # v1 is left for an operator; v2 lost its optimiser state as retention says, after v1 failed to.
    assert [(run / f"v{v}" / adapters.OPTIMIZER_FILE).exists() for v in (1, 2, 3, 4)] == [True, False, True, True]


@pytest.mark.parametrize("how", ["weights bit-flipped", "manifest torn", "weights missing"])
def test_a_damaged_version_is_quarantined_and_written_again(policy, blobs, tmp_path, how, caplog):
    learner = _learner(policy, blobs, tmp_path, keep_last=3)
    run = tmp_path / "ck" / "dmg"
    refs = {v: _batch(blobs, v) for v in (1, 2)}
    _update(learner, "dmg", 1, refs[1])
    first = _update(learner, "dmg", 2, refs[2])
    good = (run / "v2" / adapters.ADAPTER_FILE).read_bytes()
    w = run / "v2" / adapters.ADAPTER_FILE
    if how == "weights bit-flipped":
        data = bytearray(good)
        data[len(data) // 2] ^= 0x01
        w.write_bytes(bytes(data))
    elif how == "manifest torn":
        (run / "v2" / adapters.MANIFEST_FILE).write_bytes(b'{"run_id": "d')
    else:
        w.unlink()
    # The retry of the update (the activity after a crash, or Temporal's retry) writes v2 again from v1.
    with caplog.at_level(logging.WARNING, logger="halo_learner.adapters"):
        again = _update(learner, "dmg", 2, refs[2])
    assert again.reused is False
    assert adapters.damage(run / "v2") is None
    assert (run / "v2" / adapters.ADAPTER_FILE).read_bytes() == good  # the same update from the same parent
    assert again.loss == pytest.approx(first.loss)
    aside = list((run / adapters.QUARANTINE_DIR).iterdir())
    assert len(aside) == 1 and aside[0].name.startswith("v2-")
    assert str(aside[0]) in caplog.text and "damaged" in caplog.text
    # Quarantined folders are not versions: retention and the next update ignore them.
    assert sorted(retention.versions(run)) == [1, 2]
    assert _update(learner, "dmg", 3, _batch(blobs, 3)).reused is False


def test_save_version_writes_over_a_damaged_folder_instead_of_reusing_it(policy, tmp_path):
    path = fake_version(tmp_path, "sv", 1, weights=b"w" * 100)
    (path / adapters.ADAPTER_FILE).write_bytes(b"w" * 10)
    import torch

    opt = torch.optim.AdamW(list(policy.trainable_parameters().values()), lr=1e-3)
    out, reused = adapters.save_version(policy, opt, "sv", 1, 0, "grpo", {}, tmp_path, batch_ref="sha256:x")
    assert out == path and reused is False
    assert adapters.damage(path) is None
    assert adapters.read_manifest(path)["base_model"] == policy.model_id


def test_a_whole_version_is_reused_and_nothing_is_quarantined(policy, tmp_path):
    path = fake_version(tmp_path, "ok", 1)
    import torch

    opt = torch.optim.AdamW(list(policy.trainable_parameters().values()), lr=1e-3)
    assert adapters.save_version(policy, opt, "ok", 1, 0, "grpo", {}, tmp_path, batch_ref="sha256:x") == (path, True)
    assert not (tmp_path / "ok" / adapters.QUARANTINE_DIR).exists()
