#!/usr/bin/env python
"""Colocated sampling of concurrent calls: one call after another vs. one batched generate, side by side.

    PYTHONPATH=workers/learner python3 bench/learner_sampling.py           # GPU: random-init 8B in bf16, real shapes
    PYTHONPATH=workers/learner python3 bench/learner_sampling.py --smoke   # CPU: tiny random Qwen3-VL, same code

The calls are what the default job sends the learner when it runs colocated on a GPU box (configs/default.yaml:
`parallelism` episodes at once, each step a group of `numGenerations` candidates, `policy.maxTokens` 128), each
prompt its own 1280x720 screenshot (880 image tokens) and an accessibility-tree text. Per shape (calls x n):

  sequential   each call's `sample` alone, one after the other: the learner before batching;
  batched      `sample_batch` over all calls (halo_learner/sampling.py): one left-padded prefill, one decoding
               loop, each call's rows drawing from its own seeded generator.

Printed: seconds per round of calls, completion tokens per second, the ratio, peak GPU memory of each under the
budget vLLM at --gpu-memory-utilization 0.5 leaves (39.6 GiB on an 80 GB card; the process is capped there), and
how the batched answers compare with the sequential ones: the next-token log-probs after each prompt over the
whole vocabulary, batched prefill against the prompt's own (differences are bf16 rounding of a padded batch),
and how many completions came out with the same first token and the same tokens. Random weights spread the next-token distribution over the whole vocabulary, so a rounding difference
changes a drawn token far more often than a trained model's peaked distribution would. `--float32-shapes` then
runs the same comparison with the model in float32 (no memory cap), where rounding is too small to change a draw:
there every completion must come out the same, as on the CPU (--smoke, and the learner's tests).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workers" / "learner"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.logprobs import run_prompt, run_prompts  # noqa: E402
from halo_learner.memory import GIB, budget_bytes  # noqa: E402
from halo_learner.prompts import encode_prompt  # noqa: E402
from halo_learner.sampling import SampleRequest, sample_batch  # noqa: E402
from learner_grpo import SYSTEM, build, screenshot_ref, sync, user_text  # noqa: E402


def prompts(policy, blobs, count: int, text_tokens: int, width: int, height: int, seed: int):
    out = []
    for i in range(count):
        m = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {
                "role": "user",
                "content": [
                    {"type": "image", "ref": screenshot_ref(blobs, width, height, seed + i)},
                    # Texts of different lengths: the batch pads, as real pages' trees differ.
                    {"type": "text", "text": user_text(policy.tokenizer, text_tokens - 40 * (i % 4), seed + i)},
                ],
            },
        ]
        out.append(encode_prompt(policy.processor, m, blobs))
    return out


def timed(policy, fn):
    sync(policy)
    if policy.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn()
    sync(policy)
    peak = torch.cuda.max_memory_allocated() / GIB if policy.device.type == "cuda" else 0.0
    return out, time.perf_counter() - t0, peak


@torch.no_grad()
def prefill_difference(policy, reqs) -> tuple[float, float]:
    """The next-token log-probs over the whole vocabulary after each prompt: the batched prefill's row against the
    prompt's own prefill (max and mean abs difference over all prompts)."""
    batched = run_prompts(policy, [r.prompt for r in reqs]).last_logits.float().log_softmax(-1)
    worst, total = 0.0, 0.0
    for i, r in enumerate(reqs):
        alone = run_prompt(policy, r.prompt).last_logits.float().log_softmax(-1)[0]
        d = (alone - batched[i]).abs()
        worst, total = max(worst, float(d.max())), total + float(d.mean())
    return worst, total / len(reqs)


def table(policy, ps, shapes, max_tokens: int, temperature: float, repeats: int, explore: float = 0.0) -> None:
    print(
        "| calls x n | rows | sequential s | batched s | speed-up | completion tokens/s seq / batched | "
        "peak GiB seq / batched | prefill log-probs, batched vs. alone: max / mean abs diff | "
        "same first token / same completion |"
    )
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    for calls, n in shapes:
        reqs = [SampleRequest(ps[i], n, temperature, max_tokens, seed=100 + i, explore=explore) for i in range(calls)]

        def sequential(reqs=reqs):
            return [sample_batch(policy, [r])[0] for r in reqs]

        def batched(reqs=reqs):
            return sample_batch(policy, reqs)

        sequential()  # warm-up (kernels, allocator)
        batched()
        seq_t, bat_t, seq_peak, bat_peak = [], [], 0.0, 0.0
        for _ in range(repeats):
            seq, t, peak = timed(policy, sequential)
            seq_t.append(t)
            seq_peak = max(seq_peak, peak)
            bat, t, peak = timed(policy, batched)
            bat_t.append(t)
            bat_peak = max(bat_peak, peak)
        tokens = sum(len(c.token_ids) for call in bat for c in call)
        seq_tokens = sum(len(c.token_ids) for call in seq for c in call)
        pre_max, pre_mean = prefill_difference(policy, reqs)
        same_first = sum(a.token_ids[0] == b.token_ids[0] for x, y in zip(seq, bat) for a, b in zip(x, y))
        same = sum(a.token_ids == b.token_ids for x, y in zip(seq, bat) for a, b in zip(x, y))
        ts, tb = sorted(seq_t)[len(seq_t) // 2], sorted(bat_t)[len(bat_t) // 2]
        print(
            f"| {calls} x {n} | {calls * n} | {ts:.2f} | {tb:.2f} | **{ts / tb:.2f}x** | "
            f"{seq_tokens / ts:.0f} / {tokens / tb:.0f} | {seq_peak:.1f} / {bat_peak:.1f} | {pre_max:.4f} / "
            f"{pre_mean:.5f} | {same_first} / {same} of {calls * n} |",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny random model on CPU")
    ap.add_argument("--shapes", default="4x4,8x4,4x8", help="calls x completions per call, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=128, help="policy.maxTokens of configs/default.yaml")
    ap.add_argument("--text-tokens", type=int, default=400, help="text tokens of the longest user message")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds per mode and shape (after one warm-up)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument(
        "--explore",
        type=float,
        default=0.0,
        help="train.dynamicSampling.explore: each token drawn from (1 - e)*policy + e*uniform over what is allowed",
    )
    ap.add_argument("--float32-shapes", default="", help="shapes to run again with the model in float32 (GPU)")
    ap.add_argument("--float32-max-tokens", type=int, default=32)
    args = ap.parse_args()
    if args.smoke:
        args.max_tokens, args.text_tokens, args.repeats, args.shapes = 8, 200, 1, "4x2"
    width, height = (128, 72) if args.smoke else (1280, 720)

    policy = build(args.smoke)
    policy.model.eval()
    cuda = policy.device.type == "cuda"
    total = torch.cuda.get_device_properties(0).total_memory if cuda else 0
    budget = budget_bytes(policy.device)
    if cuda and budget:
        torch.cuda.set_per_process_memory_fraction(budget / total)
    dev = torch.cuda.get_device_name() if cuda else "CPU (smoke, tiny random model)"
    blobs = BlobStore(Path(tempfile.mkdtemp(prefix="bench-sampling-")))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    ps = prompts(policy, blobs, max(c for c, _ in shapes), args.text_tokens, width, height, seed=900)
    print(
        f"\n## learner_sampling: {dev} ({total / GIB:.1f} GiB), torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n"
        f"budget {(budget or 0) / GIB:.1f} GiB (the process is capped there); prompts {min(len(p) for p in ps)}.."
        f"{max(len(p) for p in ps)} tokens ({width}x{height} screenshot each), max_tokens {args.max_tokens}, "
        f"temperature {args.temperature}, explore {args.explore}, {args.repeats} timed rounds per row (medians)\n",
        flush=True,
    )
    table(policy, ps, shapes, args.max_tokens, args.temperature, args.repeats, args.explore)
    if args.float32_shapes and cuda:
        torch.cuda.set_per_process_memory_fraction(1.0)
        policy.model.float()
        policy.dtype = torch.float32
        torch.cuda.empty_cache()
        f32 = [tuple(int(x) for x in s.split("x")) for s in args.float32_shapes.split(",")]
        print(f"\nThe same model in float32 (no memory cap), max_tokens {args.float32_max_tokens}:\n", flush=True)
        table(policy, ps, f32, args.float32_max_tokens, args.temperature, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
