"""Chunk-size planning under a memory budget (GRPO completions, DPO pairs), and an out-of-memory retry that
shrinks instead of repeating."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from temporalio.exceptions import ApplicationError

from conftest import messages, png_ref, tokens_ref
from halo_learner.activities import LearnerActivities
from halo_learner.memory import (
    GIB,
    HEADROOM_BYTES,
    MemoryModel,
    OomHints,
    PairShape,
    _chunk_shape,
    forward_units,
    plan_dpo,
    plan_micro_batch,
)

# The 8B's shape: ~17 GiB resident, ~8 MB of activations per packed token, a 151,936-entry vocabulary.
EIGHT_B = MemoryModel(resident_bytes=int(17.0 * GIB), act_bytes_per_token=58.0 * 4096 * 36, vocab=151936)
SCREENSHOT_PROMPT = 1000  # 880 image tokens + the text of the prompt


def test_real_config_shape_fits_the_budget_vllm_leaves():
    """8 groups x 8 completions of up to 256 tokens, on an 80 GB card beside vLLM at 0.5 (~40 GiB)."""
    groups = [(SCREENSHOT_PROMPT, [256] * 8) for _ in range(8)]
    budget = 40 * GIB
    plan = plan_micro_batch(groups, cap=8, budget=budget, model=EIGHT_B)
    print(f"micro-batch {plan.micro_batch}, estimated peak {plan.peak_bytes / GIB:.1f} GiB of {budget / GIB:.0f}")
    assert plan.fits and plan.peak_bytes + HEADROOM_BYTES <= budget
    assert 1 <= plan.micro_batch < 8  # all 8 in one packed sequence would not fit
    bigger = plan_micro_batch(groups, cap=8, budget=budget, model=EIGHT_B)
    assert bigger == plan  # deterministic: a retry plans the same unless a hint says otherwise
    one_more = EIGHT_B.chunk_bytes(
        SCREENSHOT_PROMPT + (plan.micro_batch + 1) * 255 + 16, (plan.micro_batch + 1) * 255 + 1
    )
    assert one_more + HEADROOM_BYTES > budget  # the largest size that fits, not a smaller one


def test_plan_follows_the_batch_not_a_fixed_size():
    short = [(SCREENSHOT_PROMPT, [30] * 8) for _ in range(8)]
    long = [(SCREENSHOT_PROMPT, [256] * 8) for _ in range(8)]
    a = plan_micro_batch(short, cap=8, budget=40 * GIB, model=EIGHT_B)
    b = plan_micro_batch(long, cap=8, budget=40 * GIB, model=EIGHT_B)
    assert a.micro_batch == 8 and b.micro_batch < 8
    assert plan_micro_batch(long, cap=8, budget=None, model=EIGHT_B).micro_batch == 8  # no budget: the cap
    assert plan_micro_batch(long, cap=2, budget=40 * GIB, model=EIGHT_B).micro_batch <= 2
    # The padded path repeats the prompt per row, so it fits fewer rows than the packed one.
    padded = plan_micro_batch(long, cap=8, budget=40 * GIB, model=EIGHT_B, packed=False)
    assert padded.micro_batch < b.micro_batch
    hopeless = plan_micro_batch(long, cap=8, budget=18 * GIB, model=EIGHT_B)
    assert hopeless.micro_batch == 1 and not hopeless.fits


def test_oom_hints_halve_per_batch(tmp_path):
    hints = OomHints(tmp_path / "h.json")
    assert hints.cap("a") is None
    assert hints.shrink("a", 8) == 4 and hints.cap("a") == 4
    assert hints.shrink("a", 4) == 2 and hints.shrink("a", 2) == 1
    assert hints.shrink("a", 1) is None  # one row already failed: nothing smaller to try
    assert OomHints(tmp_path / "h.json").cap("a") == 1 and hints.cap("b") is None  # persisted, per batch


def test_oom_retry_runs_a_smaller_micro_batch(learner, blobs, monkeypatch):
    """The first attempt runs out of memory at 4 completions per chunk; the retry plans 2 and succeeds."""
    import halo_learner.steps as learner_mod

    m = messages(png_ref(blobs, 64, 64, 41), "Goal: archive the mail")
    rnd = random.Random(3)
    ref = blobs.put_json(
        {
            "items": [
                {
                    "prompt": m,
                    "completion": "",
                    "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(4)]),
                    "advantage": a,
                }
                for a in (0.5, -0.5, 0.25, -0.25)
            ],
            "max_completion_len": 8,
        }
    )
    seen = []
    real_step = learner_mod.grpo_step

    def step(*a, **k):
        seen.append(k["micro_batch"])
        if k["micro_batch"] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real_step(*a, **k)

    monkeypatch.setattr(learner_mod, "grpo_step", step)
    acts = LearnerActivities(learner)
    raw = {"run_id": "oom", "version": 1, "batch_ref": ref, "hyperparameters": {"learning_rate": 1e-3}}
    with pytest.raises(ApplicationError) as e:
        acts.update_policy(raw)
    assert not e.value.non_retryable and e.value.type == "OutOfMemory" and "micro-batch 2" in e.value.message
    out = acts.update_policy(raw)
    assert seen == [4, 2] and out["micro_batch"] == 2 and not out["reused"]


def test_oom_at_one_row_is_permanent(learner, blobs, monkeypatch):
    import halo_learner.steps as learner_mod

    m = messages(None, "Goal: x")
    ref = blobs.put_json(
        {
            "items": [{"prompt": m, "completion": "", "tokens_ref": tokens_ref(blobs, [20, 21]), "advantage": 1.0}],
            "max_completion_len": 8,
        }
    )

    def step(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(learner_mod, "grpo_step", step)
    acts = LearnerActivities(learner)
    with pytest.raises(ApplicationError) as e:
        acts.update_policy({"run_id": "oom1", "version": 1, "batch_ref": ref})
    assert e.value.non_retryable and "one completion (DPO: one pair) per chunk" in e.value.message


# ---- DPO: pairs packed per prompt, never split --------------------------------------------------------------

EIGHT_B_DPO = dataclasses.replace(EIGHT_B, layers=36, checkpoint_input_bytes=3.0 * 4096, heads=32)
MCTS_REAL_BUDGET = int(39.6 * GIB)  # what vLLM at 0.5 leaves of an 80 GB H100 (bench/RESULTS.md)


def _mcts_real_pairs(lo: int = 128, hi: int = 512, seed: int = 0) -> list[PairShape]:
    """configs/mcts-real.yaml's batch: 64 pairs over 16 prompts (the siblings of a node share one), completions up
    to policy.maxTokens 512, in batch order with the prompts interleaved."""
    rnd = random.Random(seed)
    return [
        PairShape(f"node-{i % 16}", SCREENSHOT_PROMPT + 140, rnd.randint(lo, hi), rnd.randint(lo, hi))
        for i in range(64)
    ]


def _cost(pairs, rows, layers: int = 0):
    """A chunk's estimated peak with its first `layers` decoder layers checkpointed."""
    lens = [n for i in rows for n in (pairs[i].chosen_len, pairs[i].rejected_len)]
    return EIGHT_B_DPO.chunk_bytes(*_chunk_shape(pairs[rows[0]].prompt_len, lens, True), False, layers)


def test_dpo_plan_fits_the_mcts_real_shape_where_padding_cannot():
    pairs = _mcts_real_pairs()
    plan = plan_dpo(pairs, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    print(
        f"packed: {plan.chunks} chunks of up to {plan.pairs_per_chunk} pairs, {plan.checkpointed} checkpointed, "
        f"estimated peak {plan.peak_bytes / GIB:.1f} GiB of {MCTS_REAL_BUDGET / GIB:.1f}"
    )
    assert plan.fits and plan.peak_bytes + HEADROOM_BYTES <= MCTS_REAL_BUDGET
    chunks = [c for g in plan.groups for c in g.chunks]
    assert sorted(i for c in chunks for i in c) == list(range(64))  # every pair once, never split
    assert all(len({pairs[i].group for i in c}) == 1 for c in chunks)  # one prompt per packed sequence
    # A prompt's 4 pairs of up to 512 tokens do not fit one sequence with every activation kept; checkpointed,
    # each prompt is one sequence: the prompt runs once per pass.
    assert len(plan.groups) == 16 and plan.chunks == 16 and plan.checkpointed == 16
    assert all(_cost(pairs, c) + HEADROOM_BYTES > MCTS_REAL_BUDGET for c in chunks)
    # The unpacked baseline repeats the prompt's activations per chunk and pads: not even one pair fits.
    fp32_lora = dataclasses.replace(EIGHT_B_DPO, act_bytes_per_token=78.0 * 4096 * 36)
    padded = plan_dpo(pairs, cap=8, budget=MCTS_REAL_BUDGET, model=fp32_lora, packed=False)
    assert not padded.fits and padded.pairs_per_chunk == 1


def test_dpo_plan_checkpoints_only_where_it_saves_a_chunk():
    # Tool-call-sized completions: a prompt's pairs fit one sequence as they are, no recompute.
    short = plan_dpo(_mcts_real_pairs(20, 80), cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    assert short.chunks == 16 and short.checkpointed == 0 and short.pairs_per_chunk == 4
    # A prompt with many long pairs: checkpointed chunks, first fit decreasing, none of them mergeable.
    many = [PairShape("a", 1288, 300 + 20 * i, 500 - 10 * i) for i in range(12)]
    plan = plan_dpo(many, cap=16, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    (g,) = plan.groups
    assert g.checkpointed and 1 < len(g.chunks) < 12
    assert all(_cost(many, c, 36) + HEADROOM_BYTES <= MCTS_REAL_BUDGET for c in g.chunks)
    for a in range(len(g.chunks)):
        for b in range(a + 1, len(g.chunks)):
            assert _cost(many, g.chunks[a] + g.chunks[b], 36) + HEADROOM_BYTES > MCTS_REAL_BUDGET


def test_dpo_plan_uses_the_budget_checkpointing_only_the_layers_it_must():
    """At mcts-real's shape each prompt's chunk checkpoints the fewest layers that fit: one fewer would not fit, and
    the costliest chunk fills the budget to within one layer's activations (checkpointing every layer of every chunk
    left a third of it unused)."""
    pairs = _mcts_real_pairs()
    plan = plan_dpo(pairs, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    room = MCTS_REAL_BUDGET - HEADROOM_BYTES
    for g in plan.groups:
        for i, c in enumerate(g.chunks):
            n = g.checkpointed_layers(i)
            assert 0 < n < 36 and _cost(pairs, c, n) <= room < _cost(pairs, c, n - 1)
    # The costliest chunk is within one decoder layer's activations of the budget (less the headroom).
    tokens = max(_pair_tokens(pairs, c) for g in plan.groups for c in g.chunks)
    assert room - plan.peak_bytes < EIGHT_B_DPO.act_bytes_per_token / 36 * tokens
    every_layer = max(_cost(pairs, c, 36) for g in plan.groups for c in g.chunks)
    print(
        f"estimated peak {plan.peak_bytes / GIB:.1f} GiB (every layer checkpointed: {every_layer / GIB:.1f}) of "
        f"{MCTS_REAL_BUDGET / GIB:.1f}; {plan.recomputed_layers} of {16 * 36} layer passes recomputed"
    )
    assert plan.peak_bytes > every_layer + 8 * GIB and plan.peak_bytes + HEADROOM_BYTES <= MCTS_REAL_BUDGET
    assert plan.recomputed_layers < 16 * 36 * 0.6
    # Halved by an out-of-memory retry: two pairs per chunk would still not fit plain, so they are checkpointed too.
    halved = plan_dpo(pairs, cap=2, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    assert halved.fits and halved.pairs_per_chunk == 2


def test_dpo_plan_prefers_more_chunks_when_the_prompt_is_cheaper_than_the_recompute():
    """Two plain chunks repeat a 50-token prompt; one chunk would recompute a dozen layers of 1600 tokens: the plan
    weighs the two in forward-token units and takes the cheaper, and with a screenshot prompt the other one."""
    short = [PairShape("a", 50, 400, 400) for _ in range(4)]
    (g,) = plan_dpo(short, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO).groups
    assert len(g.chunks) == 2 and not g.checkpointed
    one = _first_fit_layers(short)
    assert forward_units(_pair_tokens(short, range(4)), one, 36) > sum(
        forward_units(_pair_tokens(short, c), 0, 36) for c in g.chunks
    )
    screenshot = [PairShape("a", 1140, 400, 400) for _ in range(4)]
    (g,) = plan_dpo(screenshot, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO).groups
    assert len(g.chunks) == 1 and 0 < g.checkpointed_layers(0) < 36


def _pair_tokens(pairs, rows) -> int:
    lens = [n for i in rows for n in (pairs[i].chosen_len, pairs[i].rejected_len)]
    return _chunk_shape(pairs[list(rows)[0]].prompt_len, lens, True)[0]


def _first_fit_layers(pairs) -> int:
    """The fewest layers with which all the pairs fit one chunk."""
    return next(n for n in range(37) if _cost(pairs, list(range(len(pairs))), n) + HEADROOM_BYTES <= MCTS_REAL_BUDGET)


def test_dpo_plan_caps_and_grammar_cost():
    pairs = [PairShape("a", 1000, 40, 60) for _ in range(6)] + [PairShape("b", 1000, 40, 60)]
    free = plan_dpo(pairs, cap=8, budget=None, model=EIGHT_B_DPO)
    assert [g.chunks for g in free.groups] == [[[0, 1, 2, 3, 4, 5]], [[6]]]
    capped = plan_dpo(pairs, cap=4, budget=None, model=EIGHT_B_DPO)
    assert [len(c) for c in capped.groups[0].chunks] == [4, 2] and capped.pairs_per_chunk == 4
    long = [PairShape("a", 1000, 500, 500) for _ in range(4)]
    masked = [dataclasses.replace(p, constrained=True) for p in long]
    a = plan_dpo(long, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    b = plan_dpo(masked, cap=8, budget=MCTS_REAL_BUDGET, model=EIGHT_B_DPO)
    # The allowed-token tables and masked logits are counted: the masked chunk needs more layers checkpointed.
    assert b.recomputed_layers > a.recomputed_layers
    tokens, kept = _chunk_shape(1000, [500] * 8, True)
    assert EIGHT_B_DPO.chunk_bytes(tokens, kept, True, 10) > EIGHT_B_DPO.chunk_bytes(tokens, kept, False, 10)


def test_dpo_oom_retry_halves_the_pairs_per_chunk(learner, blobs, monkeypatch):
    import halo_learner.steps as learner_mod

    m = messages(png_ref(blobs, 64, 64, 43), "Goal: reply to the mail")
    ref = blobs.put_json(
        {"pairs": [{"prompt": m, "chosen": f"click_element {i}", "rejected": "scroll down 100"} for i in range(4)]}
    )
    seen = []
    real_step = learner_mod.dpo_step

    def step(*a, **k):
        seen.append((k["plan"].pairs_per_chunk, k["plan"].groups[0].chunks))
        if k["plan"].pairs_per_chunk > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real_step(*a, **k)

    monkeypatch.setattr(learner_mod, "dpo_step", step)
    acts = LearnerActivities(learner)
    raw = {"run_id": "oom-dpo", "version": 1, "batch_ref": ref, "hyperparameters": {"learning_rate": 1e-3}}
    with pytest.raises(ApplicationError) as e:
        acts.update_dpo(raw)
    assert not e.value.non_retryable and e.value.type == "OutOfMemory" and "micro-batch 2" in e.value.message
    out = acts.update_dpo(raw)
    # No budget on CPU: the first attempt packs all four pairs, the retry two per chunk.
    assert seen == [(4, [[0, 1, 2, 3]]), (2, [[0, 1], [2, 3]])] and not out["reused"]
