"""Data-parallel updates: two CPU ranks over gloo (float32 tiny model), leader and follower as the worker runs them,
write the versions one process writes: the same LoRA weights, AdamW moments and statistics, for GRPO and DPO."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import messages, png_ref, tokens_ref
from halo_learner import adapters
from halo_learner.blobs import BlobStore
from halo_learner.distributed import owners
from halo_learner.learner import Learner, Settings
from halo_learner.memory import OomHints
from halo_learner.models import load_policy
from halo_learner.payloads import UpdateDpoInput, UpdatePolicyInput

RUN = "dp"
# No clipping: a gradient twice too large (a prompt group run on both ranks) must show in the moments.
GRPO_HP = {"learning_rate": 1e-2, "kl_coef": 0.05, "temperature": 0.8, "max_grad_norm": 1e6, "stale_weight_cap": 2.0}
DPO_HP = {"learning_rate": 1e-2, "beta": 0.5, "max_grad_norm": 1e6}


def _batches(blobs: BlobStore, vocab: int) -> tuple[str, str]:
    """A GRPO batch of 4 prompts (unlike screenshots and goals) x 3 completions of unlike lengths, some with made-up
    sampler log-probs, and a DPO batch of 3 prompts x 2 pairs."""
    rnd = random.Random(7)
    sizes = [(64, 64), (96, 64), (64, 96), (32, 32)]
    prompts = [
        messages(png_ref(blobs, w, h, 30 + i), f"Goal: task {i} " + "word " * (3 * i)) for i, (w, h) in enumerate(sizes)
    ]
    items = []
    for i, m in enumerate(prompts):
        for j in range(3):
            ids = [rnd.randrange(10, vocab) for _ in range(rnd.randint(2, 9))]
            lps = [-rnd.uniform(0.5, 6.0) for _ in ids] if (i + j) % 2 else None
            items.append(
                {
                    "prompt": m,
                    "completion": f"completion {i}.{j}",
                    "tokens_ref": tokens_ref(blobs, ids, lps),
                    "advantage": rnd.uniform(-1, 1),
                }
            )
    grpo = blobs.put_json({"items": items, "max_completion_len": 12})
    pairs = []
    for m in prompts[:3]:
        for _ in range(2):
            c, r = ([rnd.randrange(10, vocab) for _ in range(rnd.randint(2, 8))] for _ in range(2))
            pairs.append(
                {
                    "prompt": m,
                    "chosen": "chosen",
                    "rejected": "rejected",
                    "chosen_tokens_ref": tokens_ref(blobs, c),
                    "rejected_tokens_ref": tokens_ref(blobs, r),
                }
            )
    return grpo, blobs.put_json({"pairs": pairs})


def _updates(learner: Learner, grpo: str, dpo: str) -> None:
    """v1 GRPO, v2 DPO, v3 GRPO again: the followers carry v1 and v2 in memory between updates."""
    learner.update_policy(UpdatePolicyInput(run_id=RUN, version=1, batch_ref=grpo, hyperparameters=GRPO_HP))
    learner.update_dpo(UpdateDpoInput(run_id=RUN, version=2, batch_ref=dpo, hyperparameters=DPO_HP))
    learner.update_policy(UpdatePolicyInput(run_id=RUN, version=3, batch_ref=grpo, hyperparameters=GRPO_HP))


def _learner(tmp: Path, out: str, ranks=None) -> Learner:
    return Learner(
        load_policy("tiny-random"),
        blobs=BlobStore(tmp / "blobs"),
        checkpoints=tmp / out,
        settings=Settings(micro_batch=2, dpo_pairs_per_chunk=1),
        oom_hints=OomHints(tmp / f"oom-{out}.json"),
        ranks=ranks,
    )


def _rank(rank: int, address: str, tmp: str, grpo: str, dpo: str) -> None:
    """One rank of the two, in a process of its own."""
    torch.set_num_threads(1)
    from halo_learner import dpo as dpo_mod
    from halo_learner import grpo as grpo_mod
    from halo_learner.distributed import connect
    from halo_learner.follower import follow

    shards: list = []
    for mod, name in ((grpo_mod, "shard_chunks"), (dpo_mod, "shard_groups")):
        real = getattr(mod, name)

        def recorded(*a, _real=real, _name=name, **k):
            mine = _real(*a, **k)
            shards.append([_name, sorted(mine)])
            return mine

        setattr(mod, name, recorded)
    learner = _learner(Path(tmp), "two", connect(rank, 2, address, torch.device("cpu"), "gloo", timeout_s=300))
    if rank == 0:
        _updates(learner, grpo, dpo)
    else:
        follow(learner)
    learner.ranks.close()
    Path(tmp, f"shards-{rank}.json").write_text(json.dumps(shards))


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _version(root: Path, v: int) -> tuple[dict, dict, dict]:
    path = adapters.version_dir(RUN, v, root)
    metrics = adapters.read_manifest(path)["metrics"]
    return load_file(path / adapters.ADAPTER_FILE), load_file(path / adapters.OPTIMIZER_FILE), metrics


def test_owners_spread_units_by_cost_and_never_split_one():
    assert owners([5, 1, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1, 1]
    assert owners([3, 3, 2, 2], 2) == [0, 1, 0, 1]
    assert owners([1.0], 3) == [0]
    assert sorted(owners([4, 3, 2, 1], 1)) == [0, 0, 0, 0]


def test_two_gloo_ranks_update_as_one_process(tmp_path, policy):
    blobs = BlobStore(tmp_path / "blobs")
    grpo, dpo = _batches(blobs, len(policy.tokenizer))
    ctx = multiprocessing.get_context("spawn")
    address = _free_address()
    env = {"HALO_HOME": os.environ["HALO_HOME"], "OMP_NUM_THREADS": "1"}
    os.environ.update(env)
    procs = [ctx.Process(target=_rank, args=(r, address, str(tmp_path), grpo, dpo)) for r in range(2)]
    for p in procs:
        p.start()
    # The single process meanwhile, from the same seeded initial adapter.
    _updates(_learner(tmp_path, "one"), grpo, dpo)
    for p in procs:
        p.join(600)
    assert [p.exitcode for p in procs] == [0, 0], "a rank failed"

    shards = [json.loads((tmp_path / f"shards-{r}.json").read_text()) for r in range(2)]
    for step in range(3):  # v1 GRPO: 4 groups of 2 chunks; v2 DPO: 3 groups; v3 GRPO
        (name, a), (_, b) = shards[0][step], shards[1][step]
        units = 8 if name == "shard_chunks" else 3
        print(f"{name}: rank 0 {a}, rank 1 {b}")
        assert a and b and not set(a) & set(b) and sorted(a + b) == list(range(units))
        if name == "shard_chunks":  # a prompt's two chunks stay on one rank
            assert all((j // 2 * 2 in a) == (j in a) for j in range(units))

    for v in (1, 2, 3):
        w1, o1, m1 = _version(tmp_path / "one", v)
        w2, o2, m2 = _version(tmp_path / "two", v)
        assert w1.keys() == w2.keys() and o1.keys() == o2.keys()
        moved = max(float(t.abs().max()) for k, t in o1.items() if k.startswith("exp_avg/"))
        worst = max(float((o1[k] - o2[k]).abs().max()) for k in o1)
        wdiff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
        print(f"v{v}: largest first moment {moved:.3e}, moments differ by {worst:.2e}, weights by {wdiff:.2e}")
        assert moved > 0
        for k in o1:
            torch.testing.assert_close(o2[k], o1[k], rtol=1e-4, atol=1e-9 + 1e-5 * float(o1[k].abs().max()))
        for k in w1:
            # Adam's step divides by the gradient's own size, so an entry whose gradient is ~0 moves by float noise;
            # a wrong shard or a missing sum moves entries by ~lr (1e-2), a thousand times more.
            torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-5)
        for key in ("loss", "grad_norm", "tokens", "kl", "entropy", "clip_fraction", "capped_fraction"):
            if key in m1:
                assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-7), key
        for key in ("ratio_tokens", "reward_margin", "accuracy", "chosen_logp", "rejected_logp"):
            if key in m1:
                assert m2[key] == pytest.approx(m1[key], rel=1e-5, abs=1e-6), key
    assert _version(tmp_path / "one", 1)[2]["ratio_tokens"] > 0  # the ratio statistics are exercised
