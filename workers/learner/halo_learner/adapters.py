"""Versioned LoRA adapters on disk: checkpoints/<run_id>/v<N>/ in the layout vLLM loads.

    adapter_config.json          peft LoraConfig (r, lora_alpha, target_modules, bias "none", ...)
    adapter_model.safetensors    keys base_model.model.model.language_model.layers.N.<proj>.lora_{A,B}.weight
    optimizer.safetensors        AdamW moments, so a restarted learner continues exactly (vLLM ignores it)
    manifest.json                base model, parent version, the batch it was trained from, sha256 of
                                 every other file, metrics, time

A version folder appears only complete: everything is written into a temp folder next to it, then renamed.
A folder that exists is final, which is what makes an update idempotent per (run_id, version): a retry
with the same batch gets it back. A request for that version with another batch, or from a learner holding
another base model, is refused (`StaleVersion`, `ModelMismatch`): the folder belongs to something else
(typically an earlier run under the same run id whose Temporal state was purged).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from . import paths

ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"
MANIFEST_FILE = "manifest.json"
ADAPTER_NAME = "default"


class ParentVersionMissing(Exception):
    pass


class StaleVersion(Exception):
    """The version on disk was trained from another batch than the one this request names."""


class ModelMismatch(Exception):
    """The version on disk, or the request, belongs to another base model than the resident one."""


def check_model(expected: str | None, resident: str, what: str) -> None:
    if expected is not None and expected != resident:
        raise ModelMismatch(
            f"{what} needs base model {expected!r} but this learner holds {resident!r}; restart the learner with "
            f"HALO_MODEL={expected} (or point the run at the model the learner serves)"
        )


def check_existing(path: Path, run_id: str, version: int, batch_ref: str, resident_model: str) -> dict:
    """The manifest of an existing v<version>, if it is the one this request would have written."""
    m = read_manifest(path)
    check_model(m.get("base_model"), resident_model, f"adapter {run_id}/v{version} ({path})")
    recorded = m.get("batch_ref")
    if recorded is not None and recorded != batch_ref:
        raise StaleVersion(
            f"adapter {run_id}/v{version} at {path} was trained from batch {recorded}, not {batch_ref}: it is left "
            f"from an earlier run with the same id. Start this run under a new run id, or move {path.parent} "
            "away if that earlier run is no longer needed"
        )
    return m


def version_dir(run_id: str, version: int, root: Path | None = None) -> Path:
    return (root or paths.checkpoints_root()) / run_id / f"v{version}"


def _temp_prefix(version: int) -> str:
    return f".v{version}.tmp-"


def read_manifest(path: Path) -> dict:
    return json.loads((path / MANIFEST_FILE).read_text())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _peft_key(param_name: str) -> str:
    # In memory peft names carry the adapter name ("...lora_A.default.weight"); files do not.
    return param_name.replace(f".{ADAPTER_NAME}.", ".")


def _optimizer_tensors(policy, optimizer) -> tuple[dict[str, torch.Tensor], int]:
    tensors, step = {}, 0
    for name, p in policy.trainable_parameters().items():
        st = optimizer.state.get(p)
        if not st:
            continue
        key = _peft_key(name)
        tensors[f"exp_avg/{key}"] = st["exp_avg"].detach().contiguous().cpu()
        tensors[f"exp_avg_sq/{key}"] = st["exp_avg_sq"].detach().contiguous().cpu()
        step = int(st["step"])
    return tensors, step


def save_version(policy, optimizer, run_id: str, version: int, parent: int, kind: str, metrics: dict,
                 root: Path | None = None, batch_ref: str | None = None) -> tuple[Path, bool]:
    """Write v<version> atomically. Returns (path, reused): reused when another writer got there first."""
    final = version_dir(run_id, version, root)
    if final.exists():
        return final, True
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent, version)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(version) + f"{os.getpid()}-", dir=final.parent))
    try:
        weights = {k: v.detach().contiguous().cpu() for k, v in
                   get_peft_model_state_dict(policy.model, adapter_name=ADAPTER_NAME,
                                             save_embedding_layers=False).items()}
        save_file(weights, tmp / ADAPTER_FILE, metadata={"format": "pt"})
        cfg = policy.model.peft_config[ADAPTER_NAME]
        cfg.base_model_name_or_path = policy.model_id
        cfg.save_pretrained(str(tmp))
        opt, step = _optimizer_tensors(policy, optimizer)
        save_file(opt, tmp / OPTIMIZER_FILE, metadata={"step": str(step)})
        manifest = {
            "run_id": run_id, "version": version, "parent_version": parent, "kind": kind,
            "base_model": policy.model_id, "batch_ref": batch_ref,
            "lora": {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": sorted(cfg.target_modules)},
            "optimizer_step": step,
            "files": {f.name: _sha256(f) for f in sorted(tmp.iterdir())},
            "metrics": metrics,
            "created_at": datetime.now(timezone.utc).isoformat(),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        for f in tmp.iterdir():  # durable before it becomes visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():
                return final, True
            raise
        _fsync_dir(final.parent)
        return final, False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(run_dir: Path, version: int, older_than_s: float = 0.0) -> None:
    """Temp folders of this version left by a killed writer. One learner writes a run at a time, so any
    temp folder of the version being written now is garbage."""
    now = time.time()
    for p in run_dir.glob(_temp_prefix(version) + "*"):
        if now - p.stat().st_mtime >= older_than_s:
            shutil.rmtree(p, ignore_errors=True)


def load_version(policy, optimizer, run_id: str, version: int, root: Path | None = None,
                 with_optimizer: bool = True) -> None:
    """Copy v<version>'s LoRA weights (and optimiser moments) into the resident model."""
    path = version_dir(run_id, version, root)
    if not path.exists():
        raise ParentVersionMissing(f"adapter {run_id}/v{version} not found at {path}")
    check_model(read_manifest(path).get("base_model"), policy.model_id, f"adapter {run_id}/v{version} ({path})")
    weights = load_file(path / ADAPTER_FILE)
    params = policy.trainable_parameters()
    expected = {_peft_key(n) for n in params}
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights))[:3], sorted(set(weights) - expected)[:3]
        raise ValueError(f"adapter {path} does not fit the resident model (missing {missing}, unexpected {extra})")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[_peft_key(name)].to(p.device, p.dtype))
    if with_optimizer:
        load_optimizer(policy, optimizer, path)


def load_optimizer(policy, optimizer, path: Path) -> None:
    optimizer.state.clear()
    f = path / OPTIMIZER_FILE
    if not f.exists():
        return
    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as fh:
        step = float((fh.metadata() or {}).get("step", 0))
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    for name, p in policy.trainable_parameters().items():
        key = _peft_key(name)
        if f"exp_avg/{key}" in tensors:
            optimizer.state[p] = {
                "step": torch.tensor(step),
                "exp_avg": tensors[f"exp_avg/{key}"].to(p.device, p.dtype),
                "exp_avg_sq": tensors[f"exp_avg_sq/{key}"].to(p.device, p.dtype),
            }


def reset_to_initial(policy, optimizer) -> None:
    """Version 0 of any run: the seeded LoRA init (B = 0, so exactly the base model) and fresh AdamW."""
    with torch.no_grad():
        for name, p in policy.trainable_parameters().items():
            p.copy_(policy.initial_adapter[name])
    optimizer.state.clear()
