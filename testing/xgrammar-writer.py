"""What vLLM's xgrammar backend lets a model write under `structured_outputs.json`, for the vLLM stand-in
(testing/fake-vllm-server.ts): the stand-in's model says what it means, as tight JSON, and this process writes it
byte by byte through a GrammarMatcher compiled with the call of the vLLM release the stand-in plays. A byte the
grammar refuses where whitespace is allowed gets the whitespace first (the separators then come from xgrammar, not
from an assumption: vLLM 0.31's call requires `", "`, and xgrammar 0.2.8 may allow a space where 0.33 asked for
none, xgrammar issue 945); anything else the grammar refuses is an error that names it.

One JSON request per line on stdin, one JSON answer per line on stdout:
  {"schema": <schema object or string>, "release": "vllm-0.33" | "vllm-0.31", "disable_any_whitespace": bool,
   "text": <the JSON the model means>}
  -> {"text": <what the grammar let it write>, "xgrammar": <version>} or {"error": <why>}
  {"ping": true} -> {"xgrammar": <version>} (xgrammar is imported and the process answers)
The vocabulary is one token per byte plus an end-of-turn token, as the stand-in's own tokenizer (fake-vocab.ts).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys

import xgrammar as xgr

EOS = 256
# The whitespace a model would write where the grammar wants some: a space first, as every separator has it.
WHITESPACE = b" \n\t\r"


def compile_like(compiler, release: str, spec: str, disable_any_whitespace: bool):
    """The release's `compile_grammar` for a JSON schema, as its wheel writes it
    (vllm/v1/structured_output/backend_xgrammar.py; tools/vllm_wheel_contract.py reads it again)."""
    if release == "vllm-0.33":
        separators = (",", ":") if disable_any_whitespace else None
        return compiler.compile_json_schema(spec, any_whitespace=not disable_any_whitespace, separators=separators)
    if release == "vllm-0.31":
        return compiler.compile_json_schema(spec, any_whitespace=not disable_any_whitespace)
    raise ValueError(f"no grammar call known for release {release!r} (vllm-0.33 or vllm-0.31)")


def write(compiled, text: bytes) -> bytes:
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, EOS + 1)
    out = bytearray()

    def allowed(token: int) -> bool:
        return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)

    pos = 0
    while True:
        matcher.fill_next_token_bitmask(bitmask)
        if pos == len(text):
            if allowed(EOS):
                return bytes(out)
            ws = next((b for b in WHITESPACE if allowed(b)), None)
            if ws is None or out.endswith(bytes([ws]) * 8):
                raise ValueError(f"the grammar wants more after {bytes(out)!r}: the meant JSON is incomplete")
            matcher.accept_token(ws)
            out.append(ws)
            continue
        if allowed(text[pos]):
            matcher.accept_token(text[pos])
            out.append(text[pos])
            pos += 1
            continue
        ws = next((b for b in WHITESPACE if allowed(b)), None)
        if ws is None or out.endswith(bytes([ws]) * 8):
            raise ValueError(f"the grammar refuses {chr(text[pos])!r} after {bytes(out)!r}")
        matcher.accept_token(ws)
        out.append(ws)


def main() -> None:
    info = xgr.TokenizerInfo([bytes([b]) for b in range(256)] + [b"<|im_end|>"], stop_token_ids=[EOS])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    version = importlib.metadata.version("xgrammar")
    compiled = {}
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("ping"):
                print(json.dumps({"xgrammar": version}), flush=True)
                continue
            spec = req["schema"] if isinstance(req["schema"], str) else json.dumps(req["schema"])
            key = (req["release"], spec, bool(req["disable_any_whitespace"]))
            if key not in compiled:
                compiled[key] = compile_like(compiler, *key)
            answer = {"text": write(compiled[key], req["text"].encode()).decode(), "xgrammar": version}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the stand-in, which answers with it
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
