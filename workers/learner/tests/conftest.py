"""Shared fixtures: a private HALO_HOME per test session (the tiny model is built there once), blob helpers."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="halo-learner-tests-"))
os.environ.setdefault("HALO_HOME", str(_SESSION_HOME))
os.environ.setdefault("HALO_CHECKPOINTS", str(_SESSION_HOME / "checkpoints"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

# One thread: the tiny model gains nothing from more, and spinning threads stall when other processes hold the cores.
torch.set_num_threads(1)

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.learner import Learner, Settings  # noqa: E402
from halo_learner.memory import OomHints  # noqa: E402
from halo_learner.models import load_policy  # noqa: E402

TEMPORAL = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "temporal"

# The fast tier (`./launch.sh test fast`) runs `pytest -m "not model"`. A test that builds or loads the tiny Qwen3-VL
# or starts a Temporal server is marked `model` by the fixtures it takes; a module that does so itself says it with
# `pytestmark = pytest.mark.model`.
MODEL_FIXTURES = {"policy", "learner", "temporal_server"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)


@pytest.fixture
def blobs(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


@pytest.fixture
def policy():
    return load_policy("tiny-random")


@pytest.fixture
def learner(policy, blobs, tmp_path) -> Learner:
    return Learner(
        policy,
        blobs=blobs,
        checkpoints=tmp_path / "checkpoints",
        settings=Settings(micro_batch=4),
        oom_hints=OomHints(tmp_path / "oom-hints.json"),
    )


def png_ref(blobs: BlobStore, w: int, h: int, seed: int) -> str:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    arr = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return blobs.put(buf.getvalue(), "png")


def messages(image_ref: str | None, goal: str) -> list[dict]:
    """The shape lib/model-io/prompt.ts writes: a system text message, then a user message with screenshot + text."""
    user = ([{"type": "image", "ref": image_ref}] if image_ref else []) + [{"type": "text", "text": goal}]
    return [
        {"role": "system", "content": [{"type": "text", "text": "You are a web agent. Answer with one tool call."}]},
        {"role": "user", "content": user},
    ]


def tokens_ref(
    blobs: BlobStore, token_ids: list[int], logprobs: list[float] | None = None, grammar_ref: str | None = None
) -> str:
    """The sampler's tokens as a blob (SampledTokens), as a GRPO item references them."""
    return blobs.put_json({"token_ids": token_ids, "logprobs": logprobs, "grammar_ref": grammar_ref})


def fake_version(root: Path, run_id: str, version: int, weights: bytes = b"weights") -> Path:
    """A version folder in the layout save_version writes (without needing a model)."""
    import hashlib
    import json

    from halo_learner import adapters

    path = adapters.version_dir(run_id, version, root)
    path.mkdir(parents=True)
    files = {adapters.ADAPTER_FILE: weights, adapters.CONFIG_FILE: b'{"r": 4}', adapters.OPTIMIZER_FILE: b"moments"}
    for name, data in files.items():
        (path / name).write_bytes(data)
    manifest = {
        "run_id": run_id,
        "version": version,
        "base_model": "tiny-random",
        "batch_ref": "sha256:x",
        "files": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()},
        "metrics": {"loss": 0.5},
    }
    (path / adapters.MANIFEST_FILE).write_text(json.dumps(manifest))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def temporal_server(tmp_path_factory):
    if not TEMPORAL.exists():
        pytest.skip(f"Temporal CLI not found at {TEMPORAL}")
    home = tmp_path_factory.mktemp("temporal")
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(TEMPORAL),
            "server",
            "start-dev",
            "--headless",
            "--ip",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            str(_free_port()),
            "--metrics-port",
            str(_free_port()),
            "--db-filename",
            str(home / "temporal.db"),
            "--log-level",
            "error",
        ],
        stdout=open(home / "server.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            from temporalio.client import Client

            asyncio.run(asyncio.wait_for(Client.connect(address), 2))
            break
        except Exception as err:  # noqa: BLE001 - any failure to connect means the server is not up yet
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(
                    f"Temporal dev server did not start: {(home / 'server.log').read_text()[-2000:]}"
                ) from err
            time.sleep(0.3)
    yield address
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
