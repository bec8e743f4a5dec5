"""Exploring draws (dynamic sampling's extra candidates): tokens from (1 − ε)·π + ε·uniform(allowed), and the
log-probs the sampler reports are that mixture's, exactly, so the learner can weight the samples by π / mixture."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from conftest import messages, png_ref
from halo_learner.grammar import unpack_bitmask
from halo_learner.logprobs import packed_group_logprobs
from halo_learner.payloads import SampleActionsInput
from halo_learner.prompts import encode_prompt

SCHEMA = json.loads((Path(__file__).parent / "fixtures" / "action-schema.json").read_text())
PAGE_IDS = {3, 5, 12}


def _draw(learner, blobs, m, n: int, seed: int, explore: float, temperature: float = 1.0):
    inp = SampleActionsInput(
        run_id="x",
        prompt_ref=blobs.put_json(m),
        n=n,
        temperature=temperature,
        max_tokens=128,
        seed=seed,
        grammar_ref=blobs.put_json(SCHEMA),
        explore=explore,
    )
    return inp.grammar_ref, learner.sample_actions(inp).completions


def test_reported_logprobs_are_the_mixtures(learner, blobs):
    policy = learner.policy
    m = messages(png_ref(blobs, 96, 64, 4), "Goal: click the button")
    eps, temp = 0.3, 0.9
    grammar_ref, out = _draw(learner, blobs, m, 6, 21, eps, temp)
    prompt = encode_prompt(policy.processor, m, blobs)
    ids = [c.token_ids for c in out]
    masks = [learner.grammars.completion_bitmask(grammar_ref, i) for i in ids]
    with torch.no_grad():
        pi, _ = packed_group_logprobs(policy, prompt, ids, temp, bitmasks=masks)
    below = 0
    for i, c in enumerate(out):
        n = len(c.token_ids)
        allowed = unpack_bitmask(masks[i], learner.grammars.vocab_size).sum(-1).float()
        want = torch.log((1 - eps) * pi[i, :n].exp() + eps / allowed)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
        # A token the model disfavours is reported likelier than π says: that is what the learner weights down.
        below += int((torch.tensor(c.logprobs) > pi[i, :n] + 1e-6).sum())
    assert below > 0


def test_full_exploration_spreads_over_every_element(learner, blobs):
    m = messages(png_ref(blobs, 96, 64, 9), "Goal: click the button")
    seen: dict[float, Counter] = {}
    for eps in (0.0, 1.0):
        ids: Counter = Counter()
        kinds: Counter = Counter()
        for seed in range(4):
            _, out = _draw(learner, blobs, m, 32, seed, eps)
            for c in out:
                args = json.loads(c.text)["arguments"]
                kinds[args["action"]] += 1
                if "element_id" in args:
                    assert args["element_id"] in PAGE_IDS
                    ids[args["element_id"]] += 1
        seen[eps] = ids
        if eps == 1.0:
            assert set(ids) == PAGE_IDS, ids
            assert len(kinds) >= 6, kinds
    # Exploration changes what is drawn (ε = 0 is the model's own preference, whatever it is).
    assert seen[0.0] != seen[1.0]


def test_greedy_ignores_exploration(learner, blobs):
    m = messages(png_ref(blobs, 96, 64, 2), "Goal: click the button")
    _, plain = _draw(learner, blobs, m, 2, 1, 0.0, temperature=0.0)
    _, explored = _draw(learner, blobs, m, 2, 1, 1.0, temperature=0.0)
    assert [c.token_ids for c in plain] == [c.token_ids for c in explored]
