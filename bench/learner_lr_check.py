#!/usr/bin/env python
"""Does a learning rate move an 8B LoRA at all? Constrained colocated sampling + update_policy on a synthetic task.

    .venv/bin/python bench/learner_lr_check.py                 # GPU: random-init Qwen3-VL-8B in bf16 (bench/learner_grpo.py)
    .venv/bin/python bench/learner_lr_check.py --smoke         # CPU: tiny random Qwen3-VL, same code, about a minute

The task: a 1280x720 screenshot and the accessibility tree of a page with elements [3], [5] and [12]; the
action grammar is lib/model-io/action-grammar.ts's schema for that page (workers/learner/tests/fixtures/action-schema.json);
reward 1 when the sampled action is `click_element 5`, else 0. Each update: N completions sampled by the
learner's own `sample_actions` under the grammar, advantages r - mean(r) (dr_grpo), one `update_policy` (the
production code path: masked log-probs, the sampler's log-probs as the old policy's, AdamW on LoRA rank 16).
Before every update the share of rewarded samples is measured on --eval-samples fresh samples, and the masked
log-probability of one rewarded completion the base model sampled is computed exactly. Printed per learning rate as a curve.

Weights are random, so the base policy is near-uniform over what the grammar allows: the question is only
whether the update rule at that learning rate moves the probability of a rewarded choice within 20 updates.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workers" / "learner"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from halo_learner import adapters  # noqa: E402
from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.learner import Learner, Settings  # noqa: E402
from halo_learner.logprobs import packed_group_logprobs  # noqa: E402
from halo_learner.payloads import SampleActionsInput, UpdatePolicyInput  # noqa: E402
from halo_learner.prompts import encode_prompt  # noqa: E402
from learner_grpo import build, screenshot_ref  # noqa: E402

SCHEMA = json.loads((ROOT / "workers/learner/tests/fixtures/action-schema.json").read_text())
TREE = '[3] text "Click the button." @(200,111)\n[5] button "Click Me!" @(76,629)\n[12] textbox value="" @(1,2)'


def rewarded(text: str) -> bool:
    try:
        args = json.loads(text)["arguments"]
    except (ValueError, KeyError, TypeError):
        return False
    return args.get("action") == "click_element" and args.get("element_id") == 5


def messages(image_ref: str) -> list[dict]:
    return [
        {"role": "system", "content": [{"type": "text", "text": "You are a web agent. Answer with one tool call."}]},
        {
            "role": "user",
            "content": [
                {"type": "image", "ref": image_ref},
                {
                    "type": "text",
                    "text": f"Goal: Click the button.\n\nAccessibility tree:\n{TREE}\n\nWhat is the next action?",
                },
            ],
        },
    ]


def sequence_logprob(learner: Learner, msgs, grammar_ref: str, ids: list[int], version: int, run_id: str) -> float:
    """Masked log-probability of one completion under adapter `version` (0: the base model)."""
    policy = learner.policy
    mask = learner.grammars.completion_bitmask(grammar_ref, ids)
    prompt = encode_prompt(policy.processor, msgs, learner.blobs)
    with torch.no_grad():
        if version == 0:
            with policy.model.disable_adapter():
                lp, m = packed_group_logprobs(policy, prompt, [ids], 1.0, bitmasks=[mask])
        else:
            learner._ensure(run_id, version, with_optimizer=False)
            lp, m = packed_group_logprobs(policy, prompt, [ids], 1.0, bitmasks=[mask])
    return float(lp[m].sum())


def run_lr(
    learner: Learner, lr: float, updates: int, n: int, eval_samples: int, max_tokens: int, run_id: str
) -> list[dict]:
    blobs = learner.blobs
    msgs = messages(screenshot_ref(blobs, 1280, 720, 7))
    prompt_ref, grammar_ref = blobs.put_json(msgs), blobs.put_json(SCHEMA)
    curve = []

    def sample(version: int, k: int, seed: int):
        return learner.sample_actions(
            SampleActionsInput(
                run_id=run_id,
                version=version,
                prompt_ref=prompt_ref,
                n=k,
                temperature=1.0,
                max_tokens=max_tokens,
                seed=seed,
                grammar_ref=grammar_ref,
            )
        ).completions

    # One rewarded completion the base policy samples (a tokenisation its grammar mask allows): its exact
    # log-probability is tracked next to the sampled share, which is noisy at a few dozen samples.
    probe = None
    for seed in range(20):
        probe = next((c.token_ids for c in sample(0, 32, 50_000 + seed) if rewarded(c.text)), None)
        if probe:
            break
    for v in range(updates + 1):
        t0 = time.monotonic()
        ev = sample(v, eval_samples, 10_000 + v)
        point = dict(
            update=v,
            p_rewarded=sum(rewarded(c.text) for c in ev) / len(ev),
            logp_probe=sequence_logprob(learner, msgs, grammar_ref, probe, v, run_id) if probe else None,
        )
        if v < updates:
            batch = sample(v, n, v)
            r = [1.0 if rewarded(c.text) else 0.0 for c in batch]
            mean = sum(r) / len(r)
            items = [
                dict(
                    prompt=msgs,
                    completion=c.text,
                    advantage=x - mean,
                    grammar_ref=grammar_ref,
                    tokens_ref=blobs.put_json(
                        {"token_ids": c.token_ids, "logprobs": c.logprobs, "grammar_ref": grammar_ref}
                    ),
                )
                for c, x in zip(batch, r)
            ]
            ref = blobs.put_json({"items": items, "max_completion_len": max_tokens})
            out = learner.update_policy(
                UpdatePolicyInput(
                    run_id=run_id,
                    version=v + 1,
                    batch_ref=ref,
                    hyperparameters=dict(learning_rate=lr, temperature=1.0, kl_coef=0.0),
                )
            )
            point.update(batch_rewarded=sum(r), grad_norm=round(out.grad_norm, 4), clip_fraction=out.clip_fraction)
        point["seconds"] = round(time.monotonic() - t0, 2)
        curve.append(point)
        print(json.dumps({"lr": lr, **point}), flush=True)
    return curve


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny random model on CPU")
    ap.add_argument("--lrs", default="1e-5,1e-4", help="comma-separated learning rates (configs/grpo-real.yaml: 1e-5)")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--n", type=int, default=8, help="samples per update (train.numGenerations)")
    ap.add_argument("--eval-samples", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.monotonic()
    policy = build(args.smoke)
    print(f"model built in {time.monotonic() - t0:.0f}s on {policy.device}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="halo-lr-check-"))
    learner = Learner(
        policy, blobs=BlobStore(tmp / "blobs"), checkpoints=tmp / "checkpoints", settings=Settings(micro_batch=8)
    )
    results = {}
    for i, lr in enumerate(float(x) for x in args.lrs.split(",")):
        adapters.reset_to_initial(policy, learner.optimizer)
        results[lr] = run_lr(learner, lr, args.updates, args.n, args.eval_samples, args.max_tokens, f"lr-check-{i}")
    print(
        "\nlearning rate | sampled share of rewarded actions at updates 0, 5, 10, 15, 20 | log p(rewarded probe) first -> last"
    )
    for lr, curve in results.items():
        ps = [f"{c['p_rewarded']:.2f}" for c in curve if c["update"] % 5 == 0]
        lp = [c["logp_probe"] for c in curve if c["logp_probe"] is not None]
        print(f"{lr:g} | {' '.join(ps)} | " + (f"{lp[0]:.2f} -> {lp[-1]:.2f}" if lp else "no rewarded sample found"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
