"""Constrained decoding: every colocated sample follows the action grammar, and the learner recomputes the
sampler's masked log-probs exactly (the same distribution), for the packed and the padded passes.

The schema is lib/model-io/action-grammar.ts's output for a page with element ids 3, 5 and 12 under a 128-token
budget (test/unit/action-grammar.test.ts checks that the fixture still equals the builder's output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import messages, png_ref, tokens_ref
from halo_learner.grammar import GrammarMismatch
from halo_learner.learner import InvalidBatch
from halo_learner.logprobs import packed_group_logprobs, padded_logprobs
from halo_learner.payloads import SampleActionsInput, UpdatePolicyInput
from halo_learner.prompts import encode_prompt

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())
PAGE_IDS = {3, 5, 12}
MAX_TOKENS = 128


def _check_action(text: str) -> dict:
    call = json.loads(text)
    assert call["name"] == "computer_use"
    args = call["arguments"]
    if "element_id" in args:
        assert args["element_id"] in PAGE_IDS
    if "coordinate" in args:
        assert all(isinstance(v, int) and 0 <= v <= 1000 for v in args["coordinate"])
    return args


def _sample(learner, blobs, n: int, seed: int, temperature: float = 1.0):
    m = messages(png_ref(blobs, 96, 64, seed), f"Goal: click the button ({seed})")
    grammar_ref = blobs.put_json(SCHEMA)
    inp = SampleActionsInput(
        run_id="g",
        version=0,
        prompt_ref=blobs.put_json(m),
        n=n,
        temperature=temperature,
        max_tokens=MAX_TOKENS,
        seed=seed,
        grammar_ref=grammar_ref,
    )
    return m, grammar_ref, learner.sample_actions(inp).completions


def test_every_constrained_sample_is_a_valid_action_on_the_page(learner, blobs):
    actions = []
    for seed in range(8):
        _, _, out = _sample(learner, blobs, 16, seed)
        for c in out:
            assert c.finish_reason == "stop", c.text
            actions.append(_check_action(c.text)["action"])
    assert len(actions) == 128
    assert len(set(actions)) >= 4  # the random model spreads over the action kinds, not one forced answer


def test_learner_recomputes_the_samplers_masked_logprobs(learner, blobs):
    policy = learner.policy
    m, grammar_ref, out = _sample(learner, blobs, 6, 11, temperature=0.9)
    prompt = encode_prompt(policy.processor, m, blobs)
    ids = [c.token_ids for c in out]
    masks = [learner.grammars.completion_bitmask(grammar_ref, i) for i in ids]
    with torch.no_grad():
        packed, mask = packed_group_logprobs(policy, prompt, ids, 0.9, bitmasks=masks)
        padded, _ = padded_logprobs(policy, [prompt] * len(ids), ids, 0.9, bitmasks=masks)
        unmasked, _ = packed_group_logprobs(policy, prompt, ids, 0.9)
    for i, c in enumerate(out):
        n = len(c.token_ids)
        want = torch.tensor(c.logprobs)
        assert torch.allclose(packed[i, :n], want, atol=1e-4)
        assert torch.allclose(padded[i, :n], want, atol=1e-4)
    # Without the mask the same tokens are less likely: the learner would see a ratio < 1 everywhere.
    assert float((unmasked[mask] - packed[mask]).max()) < 0
    # Forced tokens (a single allowed one) have log-prob 0.
    assert float((packed[mask] == 0).float().mean()) > 0.2


def test_a_completion_outside_its_grammar_is_refused(learner, blobs):
    ref = blobs.put_json(SCHEMA)
    bad = learner.policy.tokenizer("hello", add_special_tokens=False)["input_ids"]
    with pytest.raises(GrammarMismatch, match="not allowed by grammar"):
        learner.grammars.completion_bitmask(ref, bad)


def test_update_on_a_constrained_batch_starts_at_ratio_one(learner, blobs):
    m, grammar_ref, out = _sample(learner, blobs, 4, 5)
    items = [
        dict(
            prompt=m,
            completion=c.text,
            tokens_ref=tokens_ref(blobs, c.token_ids, c.logprobs, grammar_ref),
            advantage=a,
            grammar_ref=grammar_ref,
        )
        for c, a in zip(out, [1.0, -1.0, 0.5, -0.5])
    ]
    ref = blobs.put_json({"items": items, "max_completion_len": MAX_TOKENS})
    res = learner.update_policy(
        UpdatePolicyInput(
            run_id="g", version=1, batch_ref=ref, hyperparameters=dict(learning_rate=1e-3, temperature=1.0)
        )
    )
    assert res.ratio_tokens == sum(len(c.token_ids) for c in out)
    assert res.mean_ratio == pytest.approx(1.0, abs=1e-4) and res.clip_fraction == 0.0
    # The same batch claiming another grammar is refused, not trained on with a wrong mask.
    other = blobs.put_json({**SCHEMA, "properties": {"name": {"const": "x"}}, "required": ["name"]})
    bad = blobs.put_json({"items": [{**items[0], "grammar_ref": other}], "max_completion_len": MAX_TOKENS})
    with pytest.raises(InvalidBatch, match="not allowed by grammar"):
        learner.update_policy(UpdatePolicyInput(run_id="g", version=2, batch_ref=bad))


def test_inside_free_text_no_added_token_is_allowed(learner, blobs):
    """The tiny model once picked the `<|image_pad|>` token inside a typed text (its text is printable ASCII); the
    grammar's text admits no `<`, so neither that token nor any spelling of one can be sampled."""
    tok = learner.policy.tokenizer
    grammars = learner.grammars
    ref = blobs.put_json(SCHEMA)
    (m,) = grammars.matchers(ref, 1)
    prefix = '{"name": "computer_use", "arguments": {"action": "answer", "text": "ab'
    for t in tok(prefix, add_special_tokens=False)["input_ids"]:
        assert m.accept_token(t), tok.convert_ids_to_tokens(t)
    from halo_learner.grammar import unpack_bitmask

    mask = grammars.allocate(1)
    grammars.fill(m, mask, 0)
    allowed = unpack_bitmask(mask, grammars.vocab_size)[0]
    added = sorted(tok.get_added_vocab().values())
    assert not any(bool(allowed[i]) for i in added), [tok.convert_ids_to_tokens(i) for i in added if allowed[i]]
    lt = [i for i in range(grammars.vocab_size) if "<" in tok.decode([i])]
    assert lt and not any(bool(allowed[i]) for i in lt)
    assert allowed[tok.convert_tokens_to_ids("x") if "x" in tok.get_vocab() else tok("x")["input_ids"][0]]
