"""Constrained action decoding with xgrammar: the sampler's token mask, and the same mask for the learner.

The schema comes from the TypeScript side (lib/action-grammar.ts) as a blob `{"schema", "any_whitespace"}` (an
older blob is the bare schema, sampled compact), compiled here with the model's tokenizer exactly as vLLM's
xgrammar backend compiles `structured_outputs.json`: the free whitespace is the server's setting
(`--structured-outputs-config` disable_any_whitespace, which the blob records), properties in schema order; any
other difference would refuse completions the server sampled (GrammarMismatch). vLLM reports log-probs after the
grammar mask, so both the colocated sampler and the learner's recomputation use masked log-probs: the importance
ratio compares two distributions over the same allowed tokens, and forced tokens (one allowed) carry no
gradient.

Masks travel as xgrammar's packed bitmask (int32, one bit per vocabulary entry): an (L, V) bool tensor per
completion would need 150 MB for a 256-token completion of the 8B model's vocabulary.
"""

from __future__ import annotations

import json
import threading

import torch

from .blobs import BlobStore


class GrammarMismatch(ValueError):
    """A completion's tokens are not a path through its grammar: it was not sampled under that grammar."""


def _xgr():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - the learner's requirements install it
        raise RuntimeError("constrained decoding needs the xgrammar package (workers/learner/requirements.txt)") from e
    return xgrammar


def grammar_spec(blob: bytes | str) -> tuple[str, bool]:
    """(schema JSON, any_whitespace) of a grammar blob, in either format (lib/action-grammar.ts readGrammarBlob)."""
    value = json.loads(blob)
    if not isinstance(value, dict):
        raise ValueError(f"a grammar blob is a JSON object, got {type(value).__name__}")
    if set(value) != {"schema", "any_whitespace"}:
        return json.dumps(value), False
    schema, any_ws = value["schema"], value["any_whitespace"]
    if not isinstance(schema, dict):
        raise ValueError("grammar blob: schema must be a JSON object")
    if not isinstance(any_ws, bool):
        raise ValueError(f"grammar blob: any_whitespace must be true or false, got {any_ws!r}")
    return json.dumps(schema), any_ws


def compile_like_vllm(compiler, schema: str, any_whitespace: bool):
    """vLLM's call (v1/structured_output/backend_xgrammar.py, 0.33): `compile_json_schema(spec,
    any_whitespace=not disable_any_whitespace)` and nothing else, so xgrammar's defaults (strict_mode, separators,
    unbounded whitespace) are the server's too; passing any of them here could only make the masks differ."""
    return compiler.compile_json_schema(schema, any_whitespace=any_whitespace)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., ceil(V/32)) int32 bitmask -> (..., V) bool, True = allowed; on the bitmask's device."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.bool().flatten(-2)[..., :vocab_size]


class Grammars:
    """Compiled grammars by blob reference (a page's schema is compiled once, however many samples use it)."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int], blobs: BlobStore):
        xgr = _xgr()
        self.vocab_size = vocab_size
        self.blobs = blobs
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._compiled: dict[str, object] = {}
        self._lock = threading.Lock()
        self.widened = 0  # sampled tokens the matcher accepted outside the mask (see completion_bitmask)

    def compiled(self, ref: str):
        with self._lock:
            hit = self._compiled.get(ref)
            if hit is None:
                schema, any_whitespace = grammar_spec(self.blobs.get(ref))
                hit = compile_like_vllm(self._compiler, schema, any_whitespace)
                self._compiled[ref] = hit
            return hit

    def matchers(self, ref: str, n: int) -> list:
        xgr = _xgr()
        g = self.compiled(ref)
        return [xgr.GrammarMatcher(g) for _ in range(n)]

    def allocate(self, rows: int) -> torch.Tensor:
        return _xgr().allocate_token_bitmask(rows, self.vocab_size)

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def completion_bitmask(self, ref: str, ids: list[int]) -> torch.Tensor:
        """(len(ids), ceil(V/32)) int32: the allowed set at each position of a completion sampled under `ref`."""
        (m,) = self.matchers(ref, 1)
        out = self.allocate(len(ids))
        for t, tok in enumerate(ids):
            tok = int(tok)
            m.fill_next_token_bitmask(out, t)
            if not m.accept_token(tok):
                raise GrammarMismatch(
                    f"token {tok} at position {t} is not allowed by grammar {ref}: the completion was not sampled "
                    "under it (a sampler without constrained decoding, another tokenizer, or a vLLM whose free whitespace "
                    "is not the blob's: compare its --structured-outputs-config with policy.grammarWhitespace, halo doctor)"
                )
            word, bit = divmod(tok, 32)
            if not (int(out[t, word]) >> bit) & 1:
                # The matcher accepts it but the mask leaves it out (xgrammar's mask is exact only for the
                # tokenisations its own sampler can reach): another sampler (another xgrammar version) took this
                # path, so the token joins the allowed set rather than getting log-prob -inf.
                out[t, word] = int(out[t, word]) | (1 << bit) if bit < 31 else int(out[t, word]) | -(1 << 31)
                self.widened += 1
        return out


def masked(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Logits with disallowed entries at -inf (`allowed` broadcastable bool, or None for no mask)."""
    if allowed is None:
        return logits
    return logits.masked_fill(~allowed, float("-inf"))
