"""Reads, from a released vLLM wheel, the calls this project mirrors, and prints them as JSON.

    python tools/vllm_wheel_contract.py 0.33.0 [--cache DIR]   # pip download vllm==0.33.0 --no-deps, then read it
    python tools/vllm_wheel_contract.py path/to/vllm-….whl

Notes about vLLM go stale and copies of its files circulate in older versions, so what the learner, the stand-in
and the launch scripts assume is checked against the wheel itself (workers/learner/tests/test_vllm_wheel_contract.py):
- `grammar`: how `compile_grammar` (v1/structured_output/backend_xgrammar.py) calls `compile_json_schema` for a JSON
  schema: the `any_whitespace` expression and the separators used when `disable_any_whitespace` is on;
- `xgrammar`: the wheel's pin of xgrammar (METADATA), whose masks the learner must reproduce;
- `logprob_floor`: the value chat log-probs are clamped to (`max(lp, -9999.0)`);
- `greedy_temperature_as_one` and `logprobs_modes`: the sampler divides by 1 for greedy rows, and which modes exist;
- `lora`: the runtime routes, the status a failed `add_lora` answers, and the rank message of `validate_legal`.
Only the standard library: it runs before any dependency is installed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path


def download(version: str, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "-d", str(cache)]
        cmd += ["--disable-pip-version-check", "--quiet"]
        if subprocess.run(cmd, timeout=900).returncode != 0:
            raise SystemExit(f"pip download vllm=={version} failed: PyPI unreachable or no such release")
        found = sorted(cache.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download left no vllm-{version} wheel in {cache}")
    return found[0]


class Wheel:
    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)
        self.names = self.zip.namelist()

    def read(self, suffix: str) -> str:
        hits = [n for n in self.names if n.endswith(suffix)]
        if len(hits) != 1:
            raise SystemExit(f"expected one file ending {suffix} in the wheel, found {hits}")
        return self.zip.read(hits[0]).decode()

    def grep(self, prefix: str, pattern: str) -> list[str]:
        rx = re.compile(pattern)
        return [
            n for n in self.names if n.startswith(prefix) and n.endswith(".py") and rx.search(self.zip.read(n).decode())
        ]


def grammar_call(src: str) -> dict:
    start = src.index("def compile_grammar(")
    body = src[start : src.index("\n    def ", start + 1)]
    json_branch = body[body.index("StructuredOutputOptions.JSON:") :]
    call = re.search(r"compile_json_schema\(\s*grammar_spec,(.*?)\)", json_branch, re.S)
    if not call:
        raise SystemExit("no compile_json_schema(grammar_spec, …) in compile_grammar's JSON branch")
    args = dict(re.findall(r"(\w+)\s*=\s*([^,\n]+?)\s*(?:,|$)", call.group(1).strip(), re.M))
    separators = None
    if "separators" in args:
        m = re.search(r"separators\s*=\s*(\(.*?\))\s*if self\.disable_any_whitespace else None", body)
        if not m:
            raise SystemExit(f"separators={args['separators']} is not the expected conditional")
        separators = list(eval(m.group(1), {}))  # a literal tuple of two strings
    return {"any_whitespace": args.get("any_whitespace"), "compact_separators": separators, "arguments": sorted(args)}


def xgrammar_pin(metadata: str) -> str | None:
    m = re.search(r"^Requires-Dist: xgrammar\s*==\s*([\w.]+)", metadata, re.M)
    return m.group(1) if m else None


def lora(wheel: Wheel) -> dict:
    routes = sorted(
        set(
            re.findall(
                r'"(/v1/(?:un)?load_lora_adapter)"',
                "".join(wheel.zip.read(n).decode() for n in wheel.grep("vllm/entrypoints/", r"lora_adapter\"")),
            )
        )
    )
    add_failure = None
    for name in wheel.grep("vllm/entrypoints/", r"engine_client\.add_lora\("):
        src = wheel.zip.read(name).decode()
        after = src[src.index("engine_client.add_lora(") :][:1500]
        m = re.search(r'err_type="(\w+)",\s*status_code=HTTPStatus\.(\w+)', after)
        if m:
            add_failure = {"type": m.group(1), "status": m.group(2)}
    rank = re.search(
        r'f"LoRA rank \{(?:max_rank|self\.r)\} is greater than max_lora_rank"\s*f" \{lora_config\.max_lora_rank\}\."',
        wheel.read("lora/peft_helper.py"),
    )
    return {
        "routes": routes,
        "add_lora_failure": add_failure,
        "rank_message": "LoRA rank {rank} is greater than max_lora_rank {max}." if rank else None,
        "utility_failure_prefix": "Call to {name} method failed: "
        if "Call to {name} method failed: " in wheel.read("v1/engine/core.py")
        else None,
    }


def contract(wheel_path: Path) -> dict:
    w = Wheel(wheel_path)
    metadata = w.read(".dist-info/METADATA")
    sampler = w.read("vllm/v1/sample/sampler.py")
    floors = sorted(
        {
            m
            for n in w.grep("vllm/entrypoints/", r"-9999")
            for m in re.findall(r"max\([^()]*?,\s*(-9999(?:\.0)?)\)", w.zip.read(n).decode())
        }
    )
    model_cfg = w.read("vllm/config/model.py")
    modes = re.search(r"LogprobsMode\s*=\s*Literal\[(.*?)\]", model_cfg, re.S)
    return {
        "version": re.search(r"^Version: (\S+)", metadata, re.M).group(1),
        "grammar": grammar_call(w.read("v1/structured_output/backend_xgrammar.py")),
        "xgrammar": xgrammar_pin(metadata),
        "logprob_floor": [float(f) for f in floors],
        "greedy_temperature_as_one": bool(re.search(r"torch\.where\(temp < _SAMPLING_EPS, 1\.0, temp\)", sampler)),
        "logprobs_modes": re.findall(r'"(\w+)"', modes.group(1)) if modes else None,
        "lora": lora(w),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", help="a vllm version to download (0.33.0) or a wheel file")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "halo" / "vllm-wheels"))
    a = ap.parse_args()
    path = Path(a.wheel) if a.wheel.endswith(".whl") else download(a.wheel, Path(a.cache))
    print(json.dumps(contract(path), indent=1))


if __name__ == "__main__":
    main()
