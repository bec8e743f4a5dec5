"""Constrained action decoding with xgrammar: the sampler's token mask, and the same mask for the learner.

The schema comes from the TypeScript side (lib/model-io/grammar-blob.ts) as a blob that records the sampler's exact xgrammar
call: `{"schema", "any_whitespace", "separators", "sampler", "xgrammar"}`. It is compiled here with the model's
tokenizer as that sampler compiled it: vLLM 0.32/0.33 pass `separators=(",", ":")` when the server runs with
disable_any_whitespace and write `{"a":1}`, vLLM 0.31 passes none and writes `{"a": 1}` (both read from the released
wheels, tools/vllm-wheel-contract.py). Any other call would refuse completions the server sampled (GrammarMismatch).
Older blobs (`{"schema", "any_whitespace"}` or a bare schema, sampled compact) compile without separators, as then.
vLLM reports log-probs after the grammar mask, so both the colocated sampler and the learner's recomputation use
masked log-probs: the importance ratio compares two distributions over the same allowed tokens, and forced tokens
(one allowed) carry no gradient.

Masks travel as xgrammar's packed bitmask (int32, one bit per vocabulary entry): an (L, V) bool tensor per
completion would need 150 MB for a 256-token completion of the 8B model's vocabulary.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import threading
from dataclasses import dataclass

import torch

from .blobs import BlobStore

log = logging.getLogger(__name__)


class GrammarMismatch(ValueError):
    """A completion's tokens are not a path through its grammar: it was not sampled under that grammar."""


def _xgr():
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - the learner's requirements install it
        raise RuntimeError("constrained decoding needs the xgrammar package (workers/learner/requirements.txt)") from e
    return xgrammar


@dataclass(frozen=True)
class GrammarCall:
    """One `compile_json_schema` call: the schema, its arguments, and which sampler made it under which xgrammar."""

    schema: str
    any_whitespace: bool
    separators: tuple[str, str] | None = None
    sampler: str | None = None
    xgrammar: str | None = None


_BLOB_KEYS = {"schema", "any_whitespace", "separators", "sampler", "xgrammar"}
_OLD_BLOB_KEYS = {"schema", "any_whitespace"}


def _installed_xgrammar() -> str | None:
    try:
        return importlib.metadata.version("xgrammar")
    except importlib.metadata.PackageNotFoundError:
        return None


def grammar_spec(blob: bytes | str) -> GrammarCall:
    """The call a grammar blob records, in any of its formats (lib/model-io/grammar-blob.ts readGrammarBlob)."""
    value = json.loads(blob)
    if not isinstance(value, dict):
        raise ValueError(f"a grammar blob is a JSON object, got {type(value).__name__}")
    if set(value) not in (_BLOB_KEYS, _OLD_BLOB_KEYS):
        return GrammarCall(json.dumps(value), False)
    schema, any_ws = value["schema"], value["any_whitespace"]
    if not isinstance(schema, dict):
        raise ValueError("grammar blob: schema must be a JSON object")
    if not isinstance(any_ws, bool):
        raise ValueError(f"grammar blob: any_whitespace must be true or false, got {any_ws!r}")
    if set(value) == _OLD_BLOB_KEYS:
        return GrammarCall(json.dumps(schema), any_ws)
    seps, sampler, version = value["separators"], value["sampler"], value["xgrammar"]
    if seps is not None and not (isinstance(seps, list) and len(seps) == 2 and all(isinstance(x, str) for x in seps)):
        raise ValueError(f"grammar blob: separators must be null or two strings, got {seps!r}")
    if sampler is not None and not isinstance(sampler, str):
        raise ValueError(f"grammar blob: sampler must be null or a name, got {sampler!r}")
    if version is not None and not isinstance(version, str):
        raise ValueError(f"grammar blob: xgrammar must be null or a version, got {version!r}")
    return GrammarCall(json.dumps(schema), any_ws, tuple(seps) if seps else None, sampler, version)


def compile_like_vllm(compiler, call: GrammarCall):
    """The sampler's own call (vLLM's v1/structured_output/backend_xgrammar.py `compile_grammar`): `any_whitespace`
    and `separators` as recorded, every other argument left at xgrammar's default as the server leaves it."""
    return compiler.compile_json_schema(call.schema, any_whitespace=call.any_whitespace, separators=call.separators)


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
        self._calls: dict[str, GrammarCall] = {}
        self.xgrammar_version = _installed_xgrammar()
        self.other_xgrammar = 0  # grammars whose sampler ran another xgrammar than this learner
        self._lock = threading.Lock()
        self.widened = 0  # sampled tokens the matcher accepted outside the mask (see completion_bitmask)

    def compiled(self, ref: str):
        with self._lock:
            hit = self._compiled.get(ref)
            if hit is None:
                call = grammar_spec(self.blobs.get(ref))
                self._note_version(ref, call)
                hit = compile_like_vllm(self._compiler, call)
                self._compiled[ref] = hit
                self._calls[ref] = call
            return hit

    def _note_version(self, ref: str, call: GrammarCall) -> None:
        # Masks can differ between xgrammar releases (0.2.8 still writes a space after some commas that its
        # separators forbid, xgrammar issue 945): said once per grammar, and named again by a GrammarMismatch.
        if call.xgrammar and self.xgrammar_version and call.xgrammar != self.xgrammar_version:
            self.other_xgrammar += 1
            log.warning(
                "grammar %s was sampled by %s under xgrammar %s, the learner has %s: masks may differ",
                ref,
                call.sampler,
                call.xgrammar,
                self.xgrammar_version,
            )

    def call(self, ref: str) -> GrammarCall:
        self.compiled(ref)
        return self._calls[ref]

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
                call = self.call(ref)
                raise GrammarMismatch(
                    f"token {tok} at position {t} is not allowed by grammar {ref} (compiled with any_whitespace="
                    f"{call.any_whitespace}, separators={call.separators!r} for sampler {call.sampler}, xgrammar "
                    f"{call.xgrammar or 'unrecorded'}, learner's {self.xgrammar_version}): the completion was not sampled "
                    "under it (a sampler without constrained decoding, another tokenizer, or a vLLM whose whitespace or "
                    "release is not the blob's: compare its --structured-outputs-config and version with "
                    "policy.grammarWhitespace and policy.server, halo doctor)"
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
