"""The server's prompt ids (a token blob's prompt_ref) against the learner's own encoding of the stored prompt:
differences are counted and the first one logged; a small one is scored on the learner's encoding, one above
PROMPT_DIFF_LIMIT of the prompt drops the item with its reason; a malformed blob fails the batch."""

from __future__ import annotations

import logging
import random

import pytest

from conftest import messages, png_ref
from halo_learner.batches import InvalidBatch
from halo_learner.payloads import UpdatePolicyInput
from halo_learner.prompts import encode_prompt


def _items(learner, blobs, m, prompt_ids: list | None, n: int = 2) -> list[dict]:
    V = len(learner.policy.tokenizer)
    rnd = random.Random(7)
    items = []
    for i in range(n):
        ids = [rnd.randrange(10, V) for _ in range(3)]
        blob = {"token_ids": ids, "logprobs": [-1.0] * len(ids), "grammar_ref": None}
        if prompt_ids is not None:
            blob["prompt_ref"] = blobs.put_json({"prompt_token_ids": prompt_ids})
        items.append({"prompt": m, "completion": "x", "tokens_ref": blobs.put_json(blob), "advantage": (-1.0) ** i})
    return items


def _update(learner, blobs, run_id, items):
    return learner.update_policy(
        UpdatePolicyInput(
            run_id=run_id, version=1, batch_ref=blobs.put_json({"items": items}), hyperparameters={"kl_coef": 0.0}
        )
    )


@pytest.fixture
def prompt(learner, blobs):
    m = messages(png_ref(blobs, 64, 48, 11), "Goal: click the link")
    return m, encode_prompt(learner.policy.processor, m, blobs).input_ids.tolist()


def test_the_servers_own_encoding_matches(learner, blobs, prompt):
    m, ids = prompt
    out = _update(learner, blobs, "same-prompt", _items(learner, blobs, m, ids))
    assert out.prompt_mismatch_rate == 0.0


def test_a_different_server_encoding_is_counted_logged_and_still_scored(learner, blobs, prompt, caplog):
    m, ids = prompt
    perturbed = list(ids)
    perturbed[5] = (perturbed[5] + 1) % len(learner.policy.tokenizer)
    items = _items(learner, blobs, m, perturbed) + _items(learner, blobs, m, ids, n=1)
    with caplog.at_level(logging.WARNING, logger="halo_learner"):
        out = _update(learner, blobs, "other-prompt", items)
    assert out.prompt_mismatch_rate == pytest.approx(2 / 3)
    assert out.tokens == 9 and out.ratio_tokens == 9  # scored on the learner's encoding, with the sampler's log-probs
    warned = [r.getMessage() for r in caplog.records if "prompt ids" in r.getMessage()]
    assert len(warned) == 1, warned  # once per update, not once per item
    assert "items[0]" in warned[0] and "position 5" in warned[0]
    assert f"server {perturbed[5]} vs learner {ids[5]}" in warned[0]


def test_a_shorter_server_encoding_differs_at_its_end(learner):
    from halo_learner.prompts import compare_prompt_ids

    tok = learner.policy.tokenizer
    diff = compare_prompt_ids(tok, [11, 12], [11, 12, 13])
    assert diff.position == 2 and diff.server_id is None and diff.learner_id == 13
    assert compare_prompt_ids(tok, [11, 12], [11, 12]) is None


@pytest.mark.parametrize(
    "blob",
    [{"prompt_token_ids": [1, -2]}, {"prompt_token_ids": []}, {"prompt_token_ids": [1, "a"]}, [1, 2], {"ids": [1]}],
)
def test_a_malformed_prompt_blob_is_an_invalid_batch(learner, blobs, prompt, blob):
    m, ids = prompt
    items = _items(learner, blobs, m, ids)
    bad = {"token_ids": [11, 12], "logprobs": None, "grammar_ref": None, "prompt_ref": blobs.put_json(blob)}
    items[1]["tokens_ref"] = blobs.put_json(bad)
    with pytest.raises(InvalidBatch, match=r"items\[1\]\.tokens_ref\.prompt_ref: .* is not the server's prompt ids"):
        _update(learner, blobs, "bad-prompt", items)


def test_a_prompt_encoded_to_other_ids_in_more_than_the_limit_is_dropped_with_its_reason(
    learner, blobs, prompt, caplog
):
    # The server saw a larger image: more image tokens, and every id after them shifted.
    m, ids = prompt
    image = learner.policy.processor.image_token_id
    at = ids.index(image)
    shifted = ids[:at] + [image] * 8 + ids[at:]
    items = _items(learner, blobs, m, shifted, n=1) + _items(learner, blobs, m, ids, n=2)
    with caplog.at_level(logging.WARNING, logger="halo_learner"):
        out = _update(learner, blobs, "shifted-prompt", items)
    assert out.prompt_mismatch_rate == pytest.approx(1 / 3)
    assert out.tokens == 6 and out.ratio_tokens == 6  # the shifted item is not scored
    dropped = [r.getMessage() for r in caplog.records if "dropped: their prompt ids differ" in r.getMessage()]
    assert len(dropped) == 1 and "1 of 3 items dropped" in dropped[0] and "items[0]" in dropped[0], dropped


def test_a_batch_whose_every_prompt_differs_beyond_the_limit_fails_naming_why(learner, blobs, prompt):
    m, ids = prompt
    with pytest.raises(InvalidBatch, match="nothing to train on: 2 of 2 items dropped"):
        _update(learner, blobs, "all-shifted", _items(learner, blobs, m, ids[: len(ids) // 2]))
