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

With HALO_STORE=s3://bucket/prefix the folder is also published to the object store, written once:

    <prefix>/checkpoints/<run_id>/v<N>/files/<sha256>-<name>   every file, content-addressed
    <prefix>/checkpoints/<run_id>/v<N>/manifest.json           written last with If-None-Match: *; it commits the version

and the local folder is a cache: a version this host lacks is fetched (files checked against the manifest's
sha256) where a path is needed, for the learner to continue from it and for vLLM to load it. Two learners that
raced for one version leave one manifest; the loser's local folder is replaced by the winner's.

A local folder whose files do not match its manifest is damaged: as a parent it is missing (fetched again from the
object store when committed there); as the version an update is about to write it is quarantined under
<run_id>/.damaged/ and written again, never reported as reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from peft import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from . import file_modes, objects, paths

log = logging.getLogger(__name__)
ADAPTER_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"
MANIFEST_FILE = "manifest.json"
ADAPTER_NAME = "default"


class ParentVersionMissing(Exception):
    pass


class AdapterDamaged(ParentVersionMissing):
    """A version folder whose files do not match the sha256 its manifest records (a write torn by a crash or a
    power cut), and no object store to fetch it again from: as good as missing."""


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
    return (root or paths.checkpoints_root()) / paths.check_run_id(run_id) / f"v{version}"


def _temp_prefix(version: int) -> str:
    return f".v{version}.tmp-"


def read_manifest(path: Path) -> dict:
    return json.loads((path / MANIFEST_FILE).read_text())


def write_manifest(path: Path, manifest: dict) -> None:
    """Replace the manifest of the version folder `path` durably: a temp file fsynced, renamed over
    manifest.json, the folder fsynced; after a power cut it is the old manifest or the new one, whole."""
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".manifest-")
    try:
        os.fchmod(fd, file_modes.FILE_MODE)
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path / MANIFEST_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    paths.fsync_dir(path)


def _fsync_folder_contents(folder: Path) -> None:
    """Every file of `folder` and the folder itself on disk: before it is renamed into sight."""
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    paths.fsync_dir(folder)


# Files that matched their manifest's sha256 in this process: path -> (stat signature, sha256). A file is hashed
# once per process (0.5 GiB for an 8B adapter with its optimiser state) unless it changes on disk.
_verified: dict[str, tuple[tuple, str]] = {}


def _signature(f: Path) -> tuple:
    st = f.stat()
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def _remember(path: Path, files: dict) -> None:
    for name, sha in files.items():
        try:
            _verified[str(path / name)] = (_signature(path / name), sha)
        except OSError:
            pass


def damage(path: Path) -> str | None:
    """Why the version folder `path` is not whole, or None: its manifest unreadable, or a file it lists missing
    or unlike its sha256. The optimiser state may be missing (retention removes it after the manifest)."""
    try:
        files = read_manifest(path)["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not an object")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST_FILE} is unreadable ({e.__class__.__name__}: {e})"
    for name, sha in files.items():
        f = path / name
        try:
            sig = _signature(f)
        except FileNotFoundError:
            if name == OPTIMIZER_FILE:
                continue
            return f"{name} is missing"
        if _verified.get(str(f)) == (sig, sha):
            continue
        if _sha256(f) != sha:
            return f"{name} ({sig[0]} bytes) does not match its sha256 in {MANIFEST_FILE}"
        _verified[str(f)] = (sig, sha)
    return None


QUARANTINE_DIR = ".damaged"


def quarantine(path: Path, run_id: str, version: int, why: str) -> Path:
    """Move the damaged version folder `path` aside, under <run>/.damaged/ (kept for an operator to inspect, never
    read as a version), so that the next update of that version writes it again. Returns where it went."""
    aside_root = path.parent / QUARANTINE_DIR
    aside_root.mkdir(exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside = aside_root / f"{path.name}-{stamp}-{os.getpid()}-{time.monotonic_ns()}"
    os.rename(path, aside)
    paths.fsync_dir(path.parent)
    log.warning(
        "adapter %s/v%d at %s is damaged (%s): moved aside to %s; it will be written again",
        run_id,
        version,
        path,
        why,
        aside,
    )
    return aside


def quarantine_if_damaged(run_id: str, version: int, root: Path | None = None, store=None) -> Path | None:
    """Before v<version> is written (or reported as already written): a local folder of it that is damaged and
    that the object store cannot restore (no store, or the version not committed there) is quarantined. Returns
    where it went, or None when nothing was moved (no folder, a whole one, or one the store will fetch again)."""
    path = version_dir(run_id, version, root)
    if not path.exists():
        return None
    why = damage(path)
    if why is None:
        return None
    store = store if store is not None else remote_store()
    if store is not None and store.exists(store.loc.key(run_id, f"v{version}", MANIFEST_FILE)):
        return None  # ensure_whole fetches the committed version again
    return quarantine(path, run_id, version, why)


def ensure_whole(path: Path, run_id: str, version: int, root: Path | None = None, store=None) -> Path:
    """`path` (an existing v<version> folder) once its files match its manifest. A damaged folder is a missing
    one: fetched again from the object store when the version is committed there, else AdapterDamaged."""
    why = damage(path)
    if why is None:
        return path
    store = store if store is not None else remote_store()
    if store is not None and store.exists(store.loc.key(run_id, f"v{version}", MANIFEST_FILE)):
        log.warning(
            "adapter %s/v%d at %s is damaged (%s): fetching it again from %s", run_id, version, path, why, store.where()
        )
        aside = path.with_name(f"{_temp_prefix(version)}damaged-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)
        fetch_version(run_id, version, root, store)
        why = damage(path) if path.exists() else "it could not be fetched again"
        if why is None:
            return path
    raise AdapterDamaged(
        f"adapter {run_id}/v{version} at {path} is damaged: {why} (a write torn by a crash or power cut?). "
        f"It is treated as missing: move {path} away, then train that version again (or restore it from a copy)"
    )


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


def save_version(
    policy,
    optimizer,
    run_id: str,
    version: int,
    parent: int,
    kind: str,
    metrics: dict,
    root: Path | None = None,
    batch_ref: str | None = None,
) -> tuple[Path, bool]:
    """Write v<version> atomically. Returns (path, reused): reused when another writer got there first."""
    final = version_dir(run_id, version, root)
    quarantine_if_damaged(run_id, version, root)
    if final.exists() or fetch_version(run_id, version, root) is not None:
        return final, True
    _mkdir_durably(final.parent)
    remove_stale_temps(final.parent, version)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(version) + f"{os.getpid()}-", dir=final.parent))
    try:
        weights = {
            k: v.detach().contiguous().cpu()
            for k, v in get_peft_model_state_dict(
                policy.model, adapter_name=ADAPTER_NAME, save_embedding_layers=False
            ).items()
        }
        save_file(weights, tmp / ADAPTER_FILE, metadata={"format": "pt"})
        cfg = policy.model.peft_config[ADAPTER_NAME]
        cfg.base_model_name_or_path = policy.model_id
        cfg.save_pretrained(str(tmp))
        opt, step = _optimizer_tensors(policy, optimizer)
        save_file(opt, tmp / OPTIMIZER_FILE, metadata={"step": str(step)})
        manifest = {
            "run_id": run_id,
            "version": version,
            "parent_version": parent,
            "kind": kind,
            "base_model": policy.model_id,
            "batch_ref": batch_ref,
            "lora": {"r": cfg.r, "lora_alpha": cfg.lora_alpha, "target_modules": sorted(cfg.target_modules)},
            "optimizer_step": step,
            "files": {f.name: _sha256(f) for f in sorted(tmp.iterdir())},
            "metrics": metrics,
            "created_at": datetime.now(timezone.utc).isoformat(),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        file_modes.set_tree(tmp)  # mkdtemp made it 0700: the workers and vLLM read it too
        _fsync_folder_contents(tmp)  # durable before it becomes visible
        try:
            os.rename(tmp, final)
        except OSError:
            if final.exists():
                return final, True
            raise
        paths.fsync_dir(final.parent)
        _remember(final, manifest["files"])
        return final, not publish_version(final, run_id, version)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _mkdir_durably(folder: Path) -> None:
    """mkdir -p, with the parent of each folder it creates fsynced (its new entry survives a power cut)."""
    made, p = [], folder
    while not p.exists():
        made.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    file_modes.set_folders(made)
    for d in made:
        paths.fsync_dir(d.parent)


def remove_stale_temps(run_dir: Path, version: int, older_than_s: float = 0.0) -> None:
    """Temp folders of this version left by a killed writer. One learner writes a run at a time, so any
    temp folder of the version being written now is garbage."""
    now = time.time()
    for p in run_dir.glob(_temp_prefix(version) + "*"):
        if now - p.stat().st_mtime >= older_than_s:
            shutil.rmtree(p, ignore_errors=True)


def load_version(
    policy, optimizer, run_id: str, version: int, root: Path | None = None, with_optimizer: bool = True
) -> None:
    """Copy v<version>'s LoRA weights (and optimiser moments) into the resident model."""
    path = version_dir(run_id, version, root)
    if not path.exists():
        raise ParentVersionMissing(f"adapter {run_id}/v{version} not found at {path}")
    ensure_whole(path, run_id, version, root)
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


# ---- the object store (HALO_STORE) ---------------------------------------------------------------------

REMOTE_FILES = "files"


def remote_store() -> "objects.S3Objects | None":
    loc = objects.store_location()
    return objects.S3Objects(loc.child("checkpoints")) if loc is not None else None


def _remote_file_key(store, run_id: str, version: int, name: str, sha: str) -> str:
    return store.loc.key(run_id, f"v{version}", REMOTE_FILES, f"{sha}-{name}")


def publish_version(path: Path, run_id: str, version: int, store=None) -> bool:
    """Upload a complete local version folder; True when this folder is the version in the store (committed
    now, or the same files were committed before), False when another writer's version was committed first,
    in which case the local folder is replaced by that one. Without an object store: True, nothing to do."""
    store = store or remote_store()
    if store is None:
        return True
    manifest = read_manifest(path)
    files = {n: h for n, h in manifest.get("files", {}).items() if (path / n).exists()}
    mkey = store.loc.key(run_id, f"v{version}", MANIFEST_FILE)
    if not store.exists(mkey):
        why = damage(path)
        if why is not None:  # never publish a torn file under its manifest's sha256
            raise AdapterDamaged(
                f"adapter {run_id}/v{version} at {path} is damaged ({why}): not published to "
                f"{store.where()}; move it away and train that version again"
            )
        for name, sha in files.items():
            key = _remote_file_key(store, run_id, version, name, sha)
            if not store.exists(key):
                # Content-addressed: every writer of this key writes the same bytes.
                store.put_if_absent(key, (path / name).read_bytes(), same_bytes_everywhere=True)
        body = json.dumps({**manifest, "stored_files": files}, indent=2).encode()
        # The commit: conditional (If-None-Match: *) or refused (ConditionalPutUnsupported), never head-then-put.
        if store.put_if_absent(mkey, body, "application/json"):
            return True
    theirs = json.loads(store.get(mkey))
    mine_w, theirs_w = files.get(ADAPTER_FILE), theirs.get("stored_files", theirs.get("files", {})).get(ADAPTER_FILE)
    if mine_w is not None and mine_w == theirs_w:
        return True
    # Another learner committed this version first: its files are the version; ours go.
    aside = path.with_name(f"{_temp_prefix(version)}lost-{os.getpid()}")
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
    if fetch_version(run_id, version, path.parent.parent, store) is None:
        raise RuntimeError(
            f"adapter {run_id}/v{version}: the committed manifest in {store.where()} could not be fetched"
        )
    return False


def fetch_version(run_id: str, version: int, root: Path | None = None, store=None) -> Path | None:
    """Bring v<version> from the object store into the local folder (a cache) unless it is there; the local
    path, or None when there is no object store or the version is not in it."""
    final = version_dir(run_id, version, root)
    if final.exists():
        return final
    store = store or remote_store()
    if store is None:
        return None
    try:
        manifest = json.loads(store.get(store.loc.key(run_id, f"v{version}", MANIFEST_FILE)))
    except objects.ObjectNotFound:
        return None
    _mkdir_durably(final.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(version) + f"fetch-{os.getpid()}-", dir=final.parent))
    try:
        stored = manifest.pop("stored_files", None) or manifest.get("files", {})
        for name, sha in stored.items():
            objects.check_part(name, "adapter file name")
            data = store.get(_remote_file_key(store, run_id, version, name, sha))
            if hashlib.sha256(data).hexdigest() != sha:
                raise RuntimeError(f"adapter {run_id}/v{version}: {name} in {store.where()} does not match its sha256")
            (tmp / name).write_bytes(data)
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
        file_modes.set_tree(tmp)  # mkdtemp made it 0700: the workers and vLLM read it too
        _fsync_folder_contents(tmp)  # durable before it becomes visible
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.exists():
                raise
            return final
        paths.fsync_dir(final.parent)
        _remember(final, {n: h for n, h in manifest.get("files", {}).items() if n in stored})
        return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def synced_version_dir(run_id: str, version: int, root: Path | None = None) -> Path:
    """The local folder of v<version>, made to agree with the object store when there is one: fetched when
    only the store has it, published when only this host has it (a learner killed between writing and
    uploading)."""
    path = version_dir(run_id, version, root)
    store = remote_store()
    if version < 1:
        return path
    if store is None:
        return ensure_whole(path, run_id, version, root) if path.exists() else path
    if path.exists():
        if not store.exists(store.loc.key(run_id, f"v{version}", MANIFEST_FILE)):
            publish_version(path, run_id, version, store)
            return path
        return ensure_whole(path, run_id, version, root, store)
    fetch_version(run_id, version, root, store)
    return path
