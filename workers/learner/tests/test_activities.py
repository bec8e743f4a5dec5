"""Activity contract: snake_case payloads in and out, errors classified for Temporal's retry policy."""

from __future__ import annotations

import pytest
import torch
from temporalio.exceptions import ApplicationError

from conftest import messages, png_ref, tokens_ref
from halo_learner.activities import LearnerActivities


def _update(acts, **over):
    raw = {
        "run_id": "acts",
        "version": 1,
        "batch_ref": "sha256:" + "a" * 64 + ".json",
        "hyperparameters": {"learning_rate": 1e-3},
    }
    raw.update(over)
    return acts.update_policy(raw)


def test_invalid_input_names_the_field(learner):
    acts = LearnerActivities(learner)
    with pytest.raises(ApplicationError) as e:
        _update(acts, version=0)
    assert e.value.non_retryable and e.value.type == "InvalidPayload" and "version" in e.value.message
    with pytest.raises(ApplicationError) as e:
        _update(acts, hyperparameters={"learning_rate": 1e-3, "lr": 2})
    assert "hyperparameters.lr" in e.value.message


def test_missing_blob_is_permanent_and_names_the_ref(learner):
    acts = LearnerActivities(learner)
    with pytest.raises(ApplicationError) as e:
        _update(acts)
    assert e.value.non_retryable and e.value.type == "BlobNotFound"
    assert "sha256:" + "a" * 64 + ".json" in e.value.message


def test_invalid_batch_names_the_item_field(learner, blobs):
    acts = LearnerActivities(learner)
    ref = blobs.put_json({"items": [{"prompt": messages(None, "x"), "completion": "a", "advantage": "high"}]})
    with pytest.raises(ApplicationError) as e:
        _update(acts, batch_ref=ref)
    assert e.value.non_retryable and e.value.type == "InvalidBatch" and "items.0.advantage" in e.value.message


def test_token_blob_is_read_and_checked_by_the_learner(learner, blobs):
    """tokens_ref: a missing blob, or one that is not the sampler's tokens, fails permanently naming the item."""
    acts = LearnerActivities(learner)
    m = messages(None, "x")
    gone = "sha256:" + "b" * 64 + ".json"
    cases = [
        (gone, "BlobNotFound", gone),
        (tokens_ref(blobs, [5, 6], [-1.0]), "InvalidBatch", "items[1].tokens_ref"),  # log-probs do not pair
        (blobs.put_json({"token_ids": [], "logprobs": None}), "InvalidBatch", "token_ids"),
        (blobs.put_json({"ids": [5]}), "InvalidBatch", "items[1].tokens_ref"),
        (blobs.put("not json", "json"), "InvalidBatch", "items[1].tokens_ref"),
        (tokens_ref(blobs, [10**7]), "InvalidBatch", "outside the vocabulary"),
    ]
    for bad, kind, named in cases:
        ref = blobs.put_json(
            {
                "items": [
                    {"prompt": m, "completion": "a", "advantage": 1.0, "tokens_ref": tokens_ref(blobs, [5])},
                    {"prompt": m, "completion": "b", "advantage": -1.0, "tokens_ref": bad},
                ]
            }
        )
        with pytest.raises(ApplicationError) as e:
            _update(acts, batch_ref=ref)
        assert e.value.non_retryable and e.value.type == kind and named in e.value.message, e.value.message
    # Token arrays inline are no longer part of an item: the batch is refused as a whole.
    ref = blobs.put_json({"items": [{"prompt": m, "completion": "a", "advantage": 1.0, "completion_token_ids": [5]}]})
    with pytest.raises(ApplicationError) as e:
        _update(acts, batch_ref=ref)
    assert e.value.type == "InvalidBatch" and "completion_token_ids" in e.value.message


def test_missing_parent_is_permanent(learner, blobs):
    acts = LearnerActivities(learner)
    ref = blobs.put_json({"items": [{"prompt": messages(None, "x"), "completion": "a", "advantage": 1.0}]})
    with pytest.raises(ApplicationError) as e:
        _update(acts, batch_ref=ref, version=4)
    assert e.value.non_retryable and e.value.type == "ParentVersionMissing" and "acts/v3" in e.value.message


def test_out_of_memory_is_retryable(learner, monkeypatch):
    acts = LearnerActivities(learner)

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(learner, "update_policy", boom)
    acts = LearnerActivities(learner)
    with pytest.raises(ApplicationError) as e:
        _update(acts)
    assert not e.value.non_retryable and e.value.type == "OutOfMemory" and "out of GPU memory" in e.value.message


def test_round_trip_snake_case_payloads(learner, blobs):
    """update_policy with a text-only item (retokenised) and one by token reference, then sample_actions."""
    acts = LearnerActivities(learner)
    m = messages(png_ref(blobs, 64, 64, 1), "Goal: click OK")
    ref = blobs.put_json(
        {
            "items": [
                {
                    "prompt": m,
                    "completion": '<tool_call>{"name": "computer_use"}</tool_call>',
                    "tokens_ref": None,
                    "advantage": 0.5,
                },
                {
                    "prompt": m,
                    "completion": "click OK",
                    "tokens_ref": tokens_ref(blobs, [17, 18, 19], [-1.0, -2.0, -0.5]),
                    "advantage": -0.5,
                },
            ],
            "max_completion_len": None,
        }
    )
    out = _update(acts, batch_ref=ref)
    assert set(out) == {
        "run_id",
        "version",
        "adapter_path",
        "loss",
        "grad_norm",
        "tokens",
        "seconds",
        "reused",
        "retokenized",
        "token_mismatch_rate",
        "unknown_logprobs",
        "prompt_mismatch_rate",
        "kl",
        "clip_fraction",
        "mean_ratio",
        "ratio_tokens",
        "entropy",
        "denominator",
        "micro_batch",
    }
    assert out["kl"] is not None and out["entropy"] > 0 and out["ratio_tokens"] == 3 and out["mean_ratio"] > 0
    assert out["retokenized"] == 1 and out["token_mismatch_rate"] == 0.0 and out["reused"] is False
    s = acts.sample_actions(
        {
            "run_id": "acts",
            "version": 1,
            "prompt_ref": blobs.put_json(m),
            "n": 2,
            "temperature": 0.7,
            "max_tokens": 4,
            "seed": 3,
        }
    )
    assert set(s) == {"completions", "model", "version", "seconds", "batch_calls"} and s["version"] == 1
    assert s["batch_calls"] == 1, "a call alone is a batch of one"
    c = s["completions"][0]
    assert set(c) == {"text", "token_ids", "logprobs", "tokens_ref", "logprob_sum", "finish_reason"}
    assert c["tokens_ref"] is None and abs(c["logprob_sum"] - sum(c["logprobs"])) < 1e-6
    # As workflows ask: the same seeded draw, its tokens in a blob with the grammar (none here), nothing inline.
    stored = acts.sample_actions(
        {
            "run_id": "acts",
            "version": 1,
            "prompt_ref": blobs.put_json(m),
            "n": 2,
            "temperature": 0.7,
            "max_tokens": 4,
            "seed": 3,
            "store_tokens": True,
        }
    )
    for inline, by_ref in zip(s["completions"], stored["completions"]):
        assert by_ref["token_ids"] is None and by_ref["logprobs"] is None and by_ref["text"] == inline["text"]
        assert blobs.get_json(by_ref["tokens_ref"]) == {
            "token_ids": inline["token_ids"],
            "logprobs": inline["logprobs"],
            "grammar_ref": None,
            "prompt_ref": None,
        }
    d = acts.update_dpo(
        {
            "run_id": "acts",
            "version": 2,
            "batch_ref": blobs.put_json(
                {
                    "pairs": [
                        {
                            "prompt": m,
                            "chosen": "click OK",
                            "rejected": "scroll",
                            "ref_chosen_logprob": None,
                            "ref_rejected_logprob": None,
                        }
                    ]
                }
            ),
            "hyperparameters": {"learning_rate": 1e-3, "beta": 0.1},
        }
    )
    assert d["version"] == 2 and {"reward_margin", "accuracy"} <= set(d)
