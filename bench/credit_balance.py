#!/usr/bin/env python
"""How fast can the tiny policy learn to act differently on two pages of one task, for a given first-step credit?

    npx halo export <run> --out exports/                      # a click-collapsible-nodelay run (configs/multistep.yaml)
    .venv/bin/python bench/credit_balance.py --export exports/grpo/<run> [--updates 30]

MiniWoB++'s click-collapsible-nodelay takes two actions: click the section header (`[5]`), then Submit (`[10]`),
which on the collapsed page ends the episode as a failure. One policy must choose [5] on the first page and [10]
on the expanded one; with random weights and a ~1500-token prompt in which the two pages differ by a few dozen
tokens, telling them apart is what the LoRA has to learn. Step grouping compares a step's candidates on that
step's own shaped reward, so the first step is credited only by `new_state` (the page it reaches).

This measures that alone, without a browser: the real prompts of the exported run (first steps, and second steps
on the expanded page; 8 seeds of each held out), the same four candidate actions on each ([5], [10], [3] the goal
text, `answer`), each with its reward under two weightings of the first step, advantages r - mean(r) (dr_grpo),
and the learner's own `update_policy` (masked log-probs, AdamW on the LoRA, the run's learning rate). After every
third update it prints which candidate has the highest log-probability on each held-out page, and at the end the
first update after which both pages are right on every held-out seed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workers" / "learner"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.learner import Learner  # noqa: E402
from halo_learner.logprobs import group_logprobs  # noqa: E402
from halo_learner.models import load_policy  # noqa: E402
from halo_learner.payloads import GrpoHyperparameters, UpdatePolicyInput  # noqa: E402
from halo_learner.prompts import PromptCache  # noqa: E402

HEADER, SUBMIT, GOAL, ANSWER = "header [5]", "Submit [10]", "goal text [3]", "answer"


def tool_call(arguments: str) -> str:
    return '{"name": "computer_use", "arguments": {' + arguments + "}}"


CANDIDATES = {
    HEADER: tool_call('"action": "click_element", "element_id": 5'),
    SUBMIT: tool_call('"action": "click_element", "element_id": 10'),
    GOAL: tool_call('"action": "click_element", "element_id": 3'),
    ANSWER: tool_call('"action": "answer", "text": "done"'),
}


def rewards(new_state: float) -> tuple[dict[str, float], dict[str, float]]:
    """Shaped step rewards (configs/rewards.yaml's terms) on the first and on the expanded page."""
    valid, success, env = 0.1, 10.0, 1.0
    first = {HEADER: valid + new_state, SUBMIT: valid - env, GOAL: valid, ANSWER: 0.0}
    second = {HEADER: valid, SUBMIT: valid + env + success, GOAL: valid, ANSWER: 0.0}
    return first, second


def exported_prompts(folder: Path, blobs: BlobStore) -> tuple[list[str], list[str]]:
    """Prompt refs of first steps and of second steps on the expanded page, one per seed, in seed order."""
    first: dict[int, str] = {}
    expanded: dict[int, str] = {}
    for f in sorted(folder.glob("*.jsonl")):
        records = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        seed = records[0]["seed"]
        for step in records[1:]:
            if step["step"] == 1:
                first.setdefault(seed, step["promptRef"])
            elif seed not in expanded and b"expanded" in blobs.get(step["axtreeRef"]):
                expanded[seed] = step["promptRef"]
    return [first[s] for s in sorted(first)], [expanded[s] for s in sorted(expanded)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, required=True, help="a run's folder written by `halo export` (…/grpo/<run>)")
    ap.add_argument("--blobs", type=Path, default=ROOT / "runs" / "blobs", help="the blob folder the run wrote")
    ap.add_argument(
        "--new-state", type=float, nargs="+", default=[0.2, 2.0, 10.0], help="first-step credits to compare"
    )
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--pages", type=int, default=4, help="training pages of each kind per update")
    ap.add_argument("--lr", type=float, default=6e-3)
    args = ap.parse_args()

    first, expanded = exported_prompts(args.export, BlobStore(args.blobs))
    if len(first) < 12 or len(expanded) < 12:
        sys.exit(
            f"need at least 12 seeds of each page (8 held out): {len(first)} first pages, {len(expanded)} expanded"
        )
    held = (first[:8], expanded[:8])
    train = (first[8:], expanded[8:])
    print(f"{len(first)} first pages, {len(expanded)} expanded pages; 8 of each held out; lr {args.lr}")
    for new_state in args.new_state:
        solved = train_and_watch(args, new_state, train, held)
        print(
            f"new_state {new_state:g}: both pages right on all held-out seeds after {solved or f'more than {args.updates}'} updates"
        )


def train_and_watch(
    args, new_state: float, train: tuple[list[str], list[str]], held: tuple[list[str], list[str]]
) -> int | None:
    """Updates from the base model with this first-step credit; the first checked update with every held-out page right."""
    torch.manual_seed(0)
    rng = random.Random(0)
    policy = load_policy("tiny-random")
    im_end = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    names = list(CANDIDATES)
    ids = [policy.tokenizer(CANDIDATES[k], add_special_tokens=False)["input_ids"] + [im_end] for k in names]
    weights = rewards(new_state)
    with tempfile.TemporaryDirectory(prefix="halo-credit-") as ck:
        learner = Learner(policy, blobs=BlobStore(args.blobs), checkpoints=Path(ck))
        cache = PromptCache(policy.processor, learner.blobs)

        def preferred(refs: list[str]) -> list[str]:
            out = []
            with torch.no_grad():
                for ref in refs:
                    lp, mask = group_logprobs(policy, cache.get(learner.blobs.get_json(ref)), ids, 1.0)
                    out.append(names[int((lp * mask).sum(1).argmax())])
            return out

        for version in range(1, args.updates + 1):
            items = []
            for refs, r in zip(train, weights, strict=True):
                mean = sum(r.values()) / len(r)
                for ref in rng.sample(refs, args.pages):
                    prompt = learner.blobs.get_json(ref)
                    items += [
                        {
                            "prompt": prompt,
                            "completion": CANDIDATES[k],
                            "finish_reason": "stop",
                            "advantage": r[k] - mean,
                        }
                        for k in names
                    ]
            batch = learner.blobs.put_json({"items": items, "max_completion_len": 128})
            hp = GrpoHyperparameters(learning_rate=args.lr, kl_coef=0, temperature=1.0)
            learner.update_policy(
                UpdatePolicyInput(run_id="credit-balance", version=version, batch_ref=batch, hyperparameters=hp)
            )
            if version % 3 and version != args.updates:
                continue
            first = sum(x == HEADER for x in preferred(held[0]))
            second = sum(x == SUBMIT for x in preferred(held[1]))
            print(
                f"  new_state {new_state:g}, after {version:2d} updates: first page right {first}/8, expanded page right {second}/8",
                flush=True,
            )
            if (first, second) == (8, 8):
                return version
    return None


if __name__ == "__main__":
    main()
