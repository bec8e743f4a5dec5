"""The learner's grammar mask is the server's, for each whitespace setting and vLLM release it can be started with.

vLLM's xgrammar backend compiles `structured_outputs.json` with the server-wide `--structured-outputs-config` value
and ignores the request's own flag (v1/structured_output/backend_xgrammar.py `compile_grammar`, read from the
wheels): 0.33 (and 0.32) `compile_json_schema(spec, any_whitespace=not disable_any_whitespace, separators=(",", ":")
if disable_any_whitespace else None)`, 0.31 without `separators`. Here completions are walked at random through that
server grammar's masks (whitespace tokens picked often where allowed), and the learner, given the grammar blob the
control worker stores for that setting (lib/model-io/grammar-blob.ts), must accept every one with the very masks the walk
saw: no GrammarMismatch, no widening."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from halo_learner.grammar import GrammarMismatch, Grammars, unpack_bitmask
from halo_learner.models import load_policy
from halo_learner.sampling import stop_ids

xgr = pytest.importorskip("xgrammar")

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())
WALKS = 12
MAX_LEN = 600


@pytest.fixture(scope="module")
def tokenizer_setup():
    policy = load_policy("tiny-random")
    tok = policy.tokenizer
    vocab = policy.model.get_output_embeddings().out_features
    whitespace = {i for i in range(len(tok)) if tok.decode([i]) and not tok.decode([i]).strip(" \t\n\r")}
    assert whitespace, "the test tokenizer has whitespace tokens"
    return tok, vocab, sorted(stop_ids(tok)), whitespace


def _server_grammar(tok, vocab, stops, server: str, disable_any_whitespace: bool):
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=stops)
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    # XgrammarBackend.compile_grammar, StructuredOutputOptions.JSON, of each release's wheel.
    if server == "vllm-0.31":
        return compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=not disable_any_whitespace)
    separators = (",", ":") if disable_any_whitespace else None
    return compiler.compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=not disable_any_whitespace, separators=separators
    )


def _blob(server: str, any_whitespace: bool) -> dict:
    """What lib/model-io/grammar-blob.ts grammarBlob writes for this sampler (test/unit/action-grammar.test.ts checks that side)."""
    compact = [",", ":"] if server == "vllm-0.33" else None
    version = {"vllm-0.33": "0.2.8", "vllm-0.31": "0.2.7"}[server]
    separators = None if any_whitespace else compact
    return {
        "schema": SCHEMA,
        "any_whitespace": any_whitespace,
        "separators": separators,
        "sampler": server,
        "xgrammar": version,
    }


def _walk(compiled, vocab: int, whitespace: set[int], rng: random.Random) -> tuple[list[int], torch.Tensor]:
    """One completion drawn from the grammar's masks, ending with the stop token, and the mask at each position."""
    m = xgr.GrammarMatcher(compiled)
    rows = []
    ids: list[int] = []
    while not m.is_terminated():
        assert len(ids) < MAX_LEN, "walk did not end"
        bm = xgr.allocate_token_bitmask(1, vocab)
        m.fill_next_token_bitmask(bm, 0)
        allowed = unpack_bitmask(bm, vocab)[0].nonzero().flatten().tolist()
        ws = [t for t in allowed if t in whitespace]
        tok = rng.choice(ws if ws and rng.random() < 0.4 else allowed)
        assert m.accept_token(tok)
        ids.append(tok)
        rows.append(bm[0])
    return ids, torch.stack(rows)


def _outside_strings(text: str) -> str:
    out, in_str, esc = [], False, False
    for ch in text:
        if in_str:
            esc = not esc and ch == "\\"
            in_str = esc or ch != '"'
            continue
        in_str = ch == '"'
        out.append(ch)
    return "".join(out)


def _free_whitespace(text: str, server: str) -> bool:
    """Whitespace outside strings other than the compact separators of that server (none for 0.33's)."""
    bare = _outside_strings(text)
    if server == "vllm-0.31":
        bare = bare.replace(", ", ",").replace(": ", ":")
    return any(c in " \t\n\r" for c in bare)


@pytest.mark.parametrize(
    ("server", "setting"),
    [("vllm-0.33", "compact"), ("vllm-0.33", "any"), ("vllm-0.31", "compact"), ("vllm-0.31", "any")],
)
def test_learner_masks_equal_the_servers_for_each_whitespace_setting(tokenizer_setup, tmp_path, server, setting):
    from halo_learner.blobs import BlobStore

    tok, vocab, stops, whitespace = tokenizer_setup
    compiled = _server_grammar(tok, vocab, stops, server, disable_any_whitespace=setting == "compact")
    rng = random.Random(7)
    walks = [_walk(compiled, vocab, whitespace, rng) for _ in range(WALKS)]
    texts = [tok.decode(ids[:-1]) for ids, _ in walks]
    for t in texts:
        json.loads(t)  # every walk is a complete JSON document
    free = [_free_whitespace(t, server) for t in texts]
    assert any(free) if setting == "any" else not any(free), texts
    if (server, setting) == ("vllm-0.33", "compact"):
        assert all('","' in _outside_strings(t) or '":"' in _outside_strings(t) for t in texts), texts

    blobs = BlobStore(tmp_path / "blobs")
    grammars = Grammars(tok, vocab, stops, blobs)
    ref = blobs.put_json(_blob(server, setting == "any"))
    for ids, server_masks in walks:
        masks = grammars.completion_bitmask(ref, ids)
        assert torch.equal(masks, server_masks)
    assert grammars.widened == 0

    # A bare schema (a blob written before blobs said their whitespace) was always sampled compact, without separators.
    old = blobs.put_json(SCHEMA)
    if (server, setting) == ("vllm-0.33", "compact"):
        # What the learner compiled for every blob before: 0.31's call, which refuses each of 0.33's completions.
        for ids, _ in walks:
            with pytest.raises(GrammarMismatch, match="separators=None"):
                grammars.completion_bitmask(old, ids)
    elif setting == "compact":
        for ids, server_masks in walks:
            assert torch.equal(grammars.completion_bitmask(old, ids), server_masks)
    else:
        # What the learner did for every blob before: compact, which refuses what an `any` server samples.
        with pytest.raises(GrammarMismatch):
            for (ids, _), has_ws in zip(walks, free):
                if has_ws:
                    grammars.completion_bitmask(old, ids)


def test_a_malformed_grammar_blob_is_refused_with_its_reason(tokenizer_setup, tmp_path):
    from halo_learner.blobs import BlobStore

    tok, vocab, stops, _ = tokenizer_setup
    blobs = BlobStore(tmp_path / "blobs")
    grammars = Grammars(tok, vocab, stops, blobs)
    with pytest.raises(ValueError, match="any_whitespace must be true or false"):
        grammars.compiled(blobs.put_json({"schema": SCHEMA, "any_whitespace": "yes"}))
    with pytest.raises(ValueError, match="schema must be a JSON object"):
        grammars.compiled(blobs.put_json({"schema": [1], "any_whitespace": False}))
