"""The vLLM releases this project pins, read from their released wheels, still make the calls the project mirrors.

tools/vllm_wheel_contract.py downloads each pinned wheel (`pip download vllm==X --no-deps`, cached) and reads it; here
its findings are compared with what the learner (grammar blobs), the stand-in, the adapter activity and the token
client assume. A vLLM bump then fails here until those are re-verified. Skipped, saying so, when PyPI cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from halo_learner.payload_rules import UNKNOWN_LOGPROB_FLOOR

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "vllm_wheel_contract.py"
CACHE = Path(os.environ.get("HALO_VLLM_WHEEL_CACHE", Path.home() / ".cache" / "halo" / "vllm-wheels"))


def _pins() -> dict[str, str]:
    """The project's vLLM pins: compose's image (and ./launch.sh gpu's default), and the Python 3.10 fallback."""
    compose = re.search(r"image: vllm/vllm-openai:v([\d.]+)", (ROOT / "docker-compose.yml").read_text()).group(1)
    launch = (ROOT / "bin" / "launch-gpu.sh").read_text()
    default = re.search(r"^GPU_VLLM_DEFAULT=([\d.]+)", launch, re.M).group(1)
    fallback = re.search(r"^GPU_VLLM_NEWEST_PY310=([\d.]+)", launch, re.M).group(1)
    assert compose == default, f"docker-compose.yml runs vLLM {compose}, ./launch.sh gpu installs {default}"
    return {"vllm-0.33": default, "vllm-0.31": fallback}


def _assumed_calls() -> dict[str, dict]:
    """lib/model-io/grammar-blob.ts VLLM_GRAMMAR_CALLS, what the grammar blobs record and the learner compiles."""
    src = (ROOT / "lib" / "model-io" / "grammar-blob.ts").read_text()
    out = {}
    for name, seps, version in re.findall(
        r"'(vllm-[\d.]+)': \{ compactSeparators: (\[[^\]]*\]|null), xgrammar: '([\d.]+)' \}", src
    ):
        out[name] = {"separators": json.loads(seps.replace("'", '"')), "xgrammar": version}
    return out


def _read(version: str) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, str(TOOL), version, "--cache", str(CACHE)], capture_output=True, text=True, timeout=1200
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"downloading the vllm {version} wheel from PyPI took over 20 minutes")
    if out.returncode != 0:
        if "pip download" in out.stderr or "ERROR:" in out.stderr or "Could not" in out.stderr:
            pytest.skip(f"PyPI cannot be reached for vllm=={version} (wheel contract not checked): {out.stderr[-300:]}")
        raise AssertionError(out.stderr)
    return json.loads(out.stdout)


@pytest.mark.parametrize("release", ["vllm-0.33", "vllm-0.31"])
def test_the_pinned_wheel_makes_the_calls_the_project_mirrors(release):
    version = _pins()[release]
    assumed = _assumed_calls()
    assert set(assumed) == {"vllm-0.33", "vllm-0.31"}, assumed
    c = _read(version)
    assert c["version"] == version

    # The grammar blob's call: any_whitespace follows the server flag, separators as the table says, same xgrammar.
    assert c["grammar"]["any_whitespace"] == "not self.disable_any_whitespace"
    assert c["grammar"]["compact_separators"] == assumed[release]["separators"], (release, c["grammar"])
    assert set(c["grammar"]["arguments"]) <= {"any_whitespace", "separators"}, "a new argument the learner must mirror"
    assert c["xgrammar"] == assumed[release]["xgrammar"]

    # Log-probs: -9999 is the clamp the client and the learner read as unknown; greedy rows are not scaled.
    assert c["logprob_floor"] == [UNKNOWN_LOGPROB_FLOOR]
    policy_client = (ROOT / "activities" / "policy-client.ts").read_text()
    assert re.search(r"export const UNKNOWN_LOGPROB = -9999;", policy_client)
    assert c["greedy_temperature_as_one"]
    assert "processed_logprobs" in c["logprobs_modes"]

    # Runtime LoRA: the routes the adapter activity calls; a rank above --max-lora-rank is a 500 with this message,
    # which the stand-in answers and activities/adapters.ts recognises.
    lora = c["lora"]
    assert lora["routes"] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    assert lora["add_lora_failure"] == {"type": "InternalServerError", "status": "INTERNAL_SERVER_ERROR"}
    message = lora["utility_failure_prefix"].format(name="add_lora") + lora["rank_message"].format(rank=32, max=16)
    fake = (ROOT / "testing" / "fake-vllm-server.ts").read_text()
    assert "`Call to add_lora method failed: LoRA rank ${rank} is greater than max_lora_rank ${maxLoraRank}.`" in fake
    adapters = (ROOT / "activities" / "adapters.ts").read_text()
    rx = re.search(r"const RANK_TOO_HIGH = /(.*)/;", adapters).group(1).replace("\\\\", "\\")
    assert re.search(rx, message), (rx, message)


def _writer():
    """testing/xgrammar-writer.py, the vLLM stand-in's constrained writer (a script, so loaded from its path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("xgrammar_writer", ROOT / "testing" / "xgrammar-writer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("release", ["vllm-0.33", "vllm-0.31"])
def test_the_stand_in_writes_through_the_wheels_own_call(release):
    c = _read(_pins()[release])

    class Recorder:
        def compile_json_schema(self, spec, **kwargs):
            return kwargs

    for disable in (True, False):
        args = _writer().compile_like(Recorder(), release, "{}", disable)
        assert set(args) == set(c["grammar"]["arguments"]), (release, args, c["grammar"])
        assert args["any_whitespace"] is (not disable)
        want = c["grammar"]["compact_separators"] if disable else None
        got = list(args["separators"]) if args.get("separators") is not None else None
        assert got == want, (release, disable, args, c["grammar"])
