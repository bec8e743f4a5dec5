"""A completion exactly as vLLM 0.33 writes it with disable_any_whitespace (`,`/`:`, no spaces) trains.

The text below is what `compile_json_schema(spec, any_whitespace=False, separators=(",", ":"))` admits for the fixture
page (v1/structured_output/backend_xgrammar.py of the vllm 0.33.0 wheel); the blob is the one lib/model-io/grammar-blob.ts
stores for `policy.server: vllm-0.33`. The learner used to compile 0.31's call for every blob and refused it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from halo_learner.blobs import BlobStore
from halo_learner.grammar import GrammarMismatch, Grammars, grammar_spec
from halo_learner.models import load_policy
from halo_learner.sampling import stop_ids

pytest.importorskip("xgrammar")

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())
SERVED_033 = '{"name":"computer_use","arguments":{"action":"click_element","element_id":12}}'
SERVED_031 = '{"name": "computer_use", "arguments": {"action": "click_element", "element_id": 12}}'


def _blob(separators, sampler, version):
    return {
        "schema": SCHEMA,
        "any_whitespace": False,
        "separators": separators,
        "sampler": sampler,
        "xgrammar": version,
    }


@pytest.fixture(scope="module")
def setup():
    policy = load_policy("tiny-random")
    tok = policy.tokenizer
    stops = sorted(stop_ids(tok))
    return tok, policy.model.get_output_embeddings().out_features, stops


def _ids(tok, text: str, stop: int) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [stop]


@pytest.mark.parametrize(
    ("blob", "served", "refused"),
    [
        (_blob([",", ":"], "vllm-0.33", "0.2.8"), SERVED_033, SERVED_031),
        (_blob(None, "vllm-0.31", "0.2.7"), SERVED_031, SERVED_033),
    ],
    ids=["vllm-0.33", "vllm-0.31"],
)
def test_each_servers_compact_completion_is_accepted_under_its_own_call_only(setup, tmp_path, blob, served, refused):
    tok, vocab, stops = setup
    blobs = BlobStore(tmp_path / "blobs")
    grammars = Grammars(tok, vocab, stops, blobs)
    ref = blobs.put_json(blob)
    ids = _ids(tok, served, stops[0])
    # The tokenizer's own split of the text, not one the server's mask picks (test_grammar_whitespace.py walks
    # those): a token spanning a separator may be widened into the mask, but none is refused.
    assert grammars.completion_bitmask(ref, ids).shape[0] == len(ids)
    with pytest.raises(GrammarMismatch, match=f"sampler {blob['sampler']}, xgrammar {blob['xgrammar']}"):
        grammars.completion_bitmask(ref, _ids(tok, refused, stops[0]))


def test_a_blob_from_another_xgrammar_is_counted_and_old_blobs_keep_their_call(setup, tmp_path, caplog):
    tok, vocab, stops = setup
    grammars = Grammars(tok, vocab, stops, BlobStore(tmp_path / "blobs"))
    ref = grammars.blobs.put_json(_blob([",", ":"], "vllm-0.33", "0.0.1"))
    grammars.compiled(ref)
    grammars.compiled(ref)
    assert grammars.other_xgrammar == 1
    assert "under xgrammar 0.0.1" in caplog.text
    call = grammar_spec(json.dumps({"schema": SCHEMA, "any_whitespace": False}))
    assert (call.separators, call.sampler, call.xgrammar) == (None, None, None)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("separators", [","], "separators must be null or two strings"),
        ("sampler", 3, "sampler must be null or a name"),
        ("xgrammar", 0.28, "xgrammar must be null or a version"),
    ],
)
def test_a_malformed_call_is_refused_with_its_reason(field, value, message):
    blob = _blob([",", ":"], "vllm-0.33", "0.2.8") | {field: value}
    with pytest.raises(ValueError, match=message):
        grammar_spec(json.dumps(blob))
