"""Adapter files: vLLM-loadable layout, atomic versions, idempotency, order, and exact restart continuity."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file

from conftest import messages, png_ref, tokens_ref
from halo_learner import adapters
from halo_learner.learner import Learner, Settings
from halo_learner.models import LORA_TARGETS, VLLM_LORA_RANKS, load_policy
from halo_learner.payloads import UpdatePolicyInput


def _batch(blobs, seed: int, n: int = 4) -> str:
    rnd = random.Random(seed)
    m = messages(png_ref(blobs, 64, 64, seed), f"Goal: task {seed}")
    items = [
        {
            "prompt": m,
            "completion": "",
            "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(5)]),
            "advantage": rnd.uniform(-1, 1),
        }
        for _ in range(n)
    ]
    return blobs.put_json({"items": items, "max_completion_len": 8})


def _update(learner, blobs, run_id, version, seed, lr=1e-2):
    return learner.update_policy(
        UpdatePolicyInput(
            run_id=run_id,
            version=version,
            batch_ref=_batch(blobs, seed),
            hyperparameters={"learning_rate": lr, "kl_coef": 0.01, "temperature": 1.0},
        )
    )


def _lora_vector(learner):
    return torch.cat([p.detach().flatten().clone() for p in learner.policy.trainable_parameters().values()])


def test_saved_adapter_is_vllm_qwen3vl_format(learner, blobs):
    out = _update(learner, blobs, "fmt", 1, seed=1)
    d = adapters.version_dir("fmt", 1, learner.checkpoints)
    assert out.adapter_path == str(d)
    assert {p.name for p in d.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.safetensors",
        "manifest.json",
    }
    cfg = json.loads((d / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert cfg["r"] in VLLM_LORA_RANKS and cfg["r"] == 16 and cfg["lora_alpha"] == 32
    assert cfg["bias"] == "none" and cfg["modules_to_save"] is None and cfg["use_dora"] is False
    assert sorted(cfg["target_modules"]) == sorted(LORA_TARGETS)
    weights = load_file(d / "adapter_model.safetensors")
    n_layers = learner.policy.model.base_model.model.config.text_config.num_hidden_layers
    assert len(weights) == n_layers * len(LORA_TARGETS) * 2
    for key, t in weights.items():
        # What vLLM's Qwen3-VL mapper expects: base_model.model. + model.language_model.layers.N...
        assert key.startswith("base_model.model.model.language_model.layers."), key
        assert "visual" not in key
        assert key.endswith((".lora_A.weight", ".lora_B.weight")) and ".default." not in key
        module = key.split(".")[-3]
        assert module in LORA_TARGETS
        assert (t.shape[0] if ".lora_A." in key else t.shape[1]) == cfg["r"]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["parent_version"] == 0 and manifest["base_model"] == "tiny-random"
    for name, digest in manifest["files"].items():
        assert adapters._sha256(d / name) == digest
    assert set(manifest["files"]) == {"adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors"}


def test_update_is_idempotent_per_version(learner, blobs):
    ref = _batch(blobs, seed=2)
    hp = {"learning_rate": 1e-2, "kl_coef": 0.01, "temperature": 1.0}
    first = learner.update_policy(UpdatePolicyInput(run_id="idem", version=1, batch_ref=ref, hyperparameters=hp))
    w1 = _lora_vector(learner)
    # The same version with the same batch (a retry): nothing is applied, the same adapter comes back.
    second = learner.update_policy(UpdatePolicyInput(run_id="idem", version=1, batch_ref=ref, hyperparameters=hp))
    assert not first.reused and second.reused
    assert second.adapter_path == first.adapter_path and second.loss == first.loss and second.kl == first.kl
    assert torch.equal(_lora_vector(learner), w1)
    assert sorted(p.name for p in (learner.checkpoints / "idem").iterdir()) == ["v1"]
    m = adapters.read_manifest(learner.checkpoints / "idem" / "v1")
    assert m["batch_ref"] == ref and m["parent_version"] == 0 and m["base_model"] == "tiny-random"


def test_stale_version_from_another_batch_is_refused(learner, blobs):
    """A run id reused after its Temporal state was purged: v1 on disk came from another batch."""
    _update(learner, blobs, "stale", 1, seed=2)
    w1 = _lora_vector(learner)
    with pytest.raises(adapters.StaleVersion, match="stale/v1 .* was trained from batch sha256:.*new run id"):
        _update(learner, blobs, "stale", 1, seed=3)
    assert torch.equal(_lora_vector(learner), w1)


def test_other_base_model_is_refused(learner, blobs):
    """A request for another model, or a version written by another model, never trains on the resident one."""
    with pytest.raises(adapters.ModelMismatch, match="HALO_MODEL=Qwen/Qwen3-VL-8B-Instruct"):
        learner.update_policy(
            UpdatePolicyInput(
                run_id="model", version=1, batch_ref=_batch(blobs, 6), base_model="Qwen/Qwen3-VL-8B-Instruct"
            )
        )
    assert not (learner.checkpoints / "model").exists()
    ref = _batch(blobs, 7)
    learner.update_policy(UpdatePolicyInput(run_id="model", version=1, batch_ref=ref, base_model="tiny-random"))
    d = learner.checkpoints / "model" / "v1"
    m = adapters.read_manifest(d)
    m["base_model"] = "Qwen/Qwen3-VL-8B-Instruct"
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(adapters.ModelMismatch, match="holds 'tiny-random'"):
        learner.update_policy(UpdatePolicyInput(run_id="model", version=1, batch_ref=ref))
    learner.resident = None
    with pytest.raises(adapters.ModelMismatch):  # as the parent of v2 too
        _update(learner, blobs, "model", 2, seed=8)


def test_missing_parent_fails_clearly(learner, blobs):
    with pytest.raises(adapters.ParentVersionMissing, match="miss/v2"):
        _update(learner, blobs, "miss", 3, seed=4)
    assert not (learner.checkpoints / "miss" / "v3").exists()


def test_a_parent_torn_on_disk_is_missing_not_loaded(learner, blobs):
    """A power cut can leave a version's weights empty or cut short under an intact manifest: the learner
    checks them against the manifest's sha256 and refuses the folder as a missing parent, never trains on it."""
    _update(learner, blobs, "torn", 1, seed=21)
    f = adapters.version_dir("torn", 1, learner.checkpoints) / adapters.ADAPTER_FILE
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    learner.resident = None  # a restarted learner: v1 must be read from disk
    with pytest.raises(adapters.ParentVersionMissing, match=r"torn/v1 .* is damaged: adapter_model\.safetensors"):
        _update(learner, blobs, "torn", 2, seed=22)
    assert not (learner.checkpoints / "torn" / "v2").exists()


def test_restart_continues_exactly(learner, blobs, tmp_path):
    """A fresh learner that loads v2 from disk produces the same v3 as one that never stopped."""
    for v in (1, 2, 3):
        _update(learner, blobs, "cont", v, seed=10 + v)
    other = tmp_path / "other-checkpoints"
    (other / "cont").mkdir(parents=True)
    for v in (1, 2):
        shutil.copytree(learner.checkpoints / "cont" / f"v{v}", other / "cont" / f"v{v}")
    restarted = Learner(load_policy("tiny-random"), blobs=blobs, checkpoints=other, settings=Settings(micro_batch=4))
    _update(restarted, blobs, "cont", 3, seed=13)
    a = load_file(learner.checkpoints / "cont" / "v3" / "adapter_model.safetensors")
    b = load_file(other / "cont" / "v3" / "adapter_model.safetensors")
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"continuous vs restarted v3: max |diff| = {diff:.2e}")
    assert diff < 1e-6


def test_stale_temp_folders_are_removed(learner, blobs):
    run = learner.checkpoints / "tmpclean"
    stale = run / ".v1.tmp-999-abc"
    stale.mkdir(parents=True)
    (stale / "adapter_model.safetensors").write_bytes(b"partial")
    _update(learner, blobs, "tmpclean", 1, seed=5)
    assert sorted(p.name for p in run.iterdir()) == ["v1"]
