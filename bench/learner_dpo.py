#!/usr/bin/env python
"""DPO learner step at configs/mcts-real.yaml's shape on the Qwen3-VL-8B architecture: packed vs. padded.

    PYTHONPATH=workers/learner python3 bench/learner_dpo.py --real-shape   # GPU: random-init 8B in bf16
    PYTHONPATH=workers/learner python3 bench/learner_dpo.py --smoke        # CPU: tiny random Qwen3-VL, same code

The batch is mcts-real's: 64 pairs over 16 prompts (the siblings of one search node share its prompt, 4 pairs
each), every prompt a 1280x720 screenshot (880 image tokens) + ~160 text tokens, chosen and rejected
completions of --min-tokens..--max-tokens (128..512, policy.maxTokens 512) random token ids, beta 0.1, one
AdamW step. Model and processor are built locally as in bench/learner_grpo.py (random weights, the published
8B config, a local tokenizer with Qwen3-VL's image processor and pixel limits).

(a) bf16 log-prob check, perturbed adapter (LoRA B ~ N(0, 0.02^2)): the per-token and per-sequence log-probs
    of one prompt's 8 completions as the packed step computes them (one packed sequence) against the padded
    layout; next to it the padded layout against itself (each row alone vs. 8 rows batched), the bf16 floor.
(b) the update under the budget vLLM at --gpu-memory-utilization 0.5 leaves (39.6 GiB on an 80 GB H100), the
    process capped there (torch.cuda.set_per_process_memory_fraction), chunks planned by halo_learner.memory
    (plan_dpo); an out-of-memory error halves the pairs per chunk and retries, as the learner's retry does:
      packed  (the learner's default): per chunk (here: per prompt) one packed sequence of the prompt and its
              pairs' completions, run no-grad with the adapter disabled (the reference), then forward+backward
              with bf16 LoRA working copies, checkpointed where that saves a chunk;
      padded  (HALO_PREFIX_SHARING=0, the update as it was): per chunk of pairs the prompt's KV expanded under
              right-padded completion rows, for the reference and again for the gradient; float32 LoRA.
    With --compile, packed again with torch.compile'd decoder layers (the learner's HALO_COMPILE=1), compiled in
    its warm-up update. A mode that runs out of memory at one pair per chunk is reported as OOM. Targets for the
    packed modes: no OOM retry, <= 15 s per update (12 s since the planner checkpoints only the layers a chunk
    needs), peak <= 37 GiB. --ranks K runs the updates through the data-parallel learner (halo_learner.distributed)
    on K GPUs, one process each, the batch sharded by prompt; --ranks 1 is that code path on one GPU;
    --padded-steps 0 skips the padded mode. The last line of output is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "workers" / "learner"))

import torch  # noqa: E402
from learner_grpo import SYSTEM, build, perturb_adapter, screenshot_ref, sync, user_text  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.dpo import DpoSample, dpo_step, plan_chunks  # noqa: E402
from halo_learner.memory import GIB, budget_bytes  # noqa: E402
from halo_learner.prompts import encode_prompt, prompt_key  # noqa: E402

TARGET_SECONDS, TARGET_PEAK_GIB = 12.0, 37.0


def make_batch(policy, blobs, args, seed: int) -> list[DpoSample]:
    """`args.prompts` prompts x `args.pairs_per_prompt` pairs, in the order a search writes them (node by node)."""
    rnd = random.Random(seed)
    vocab = policy.model.base_model.model.config.text_config.vocab_size
    w, h = args.screenshot

    def completion() -> list[int]:
        return [rnd.randrange(10, vocab) for _ in range(rnd.randint(args.min_tokens, args.max_tokens))]

    samples = []
    for g in range(args.prompts):
        m = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {
                "role": "user",
                "content": [
                    {"type": "image", "ref": screenshot_ref(blobs, w, h, seed * 100 + g)},
                    {"type": "text", "text": user_text(policy.tokenizer, args.text_tokens, seed * 100 + g)},
                ],
            },
        ]
        prompt = encode_prompt(policy.processor, m, blobs)
        for _ in range(args.pairs_per_prompt):
            samples.append(DpoSample(prompt, prompt_key(m), completion(), completion()))
    return samples


def logprob_check(policy, blobs, args) -> dict:
    """Per-token and per-sequence log-probs of one prompt's pairs: packed vs. padded, with the bf16 floor."""
    from halo_learner.logprobs import packed_group_logprobs, padded_logprobs

    one = argparse.Namespace(**{**vars(args), "prompts": 1})
    batch = make_batch(policy, blobs, one, seed=77)
    prompt = batch[0].prompt
    ids = [t for s in batch for t in (s.chosen, s.rejected)]
    with torch.no_grad():
        padded, mask = padded_logprobs(policy, [prompt] * len(ids), ids, 1.0)
        packed, _ = packed_group_logprobs(policy, prompt, ids, 1.0)
        alone = torch.zeros_like(padded)
        for i, c in enumerate(ids):
            lp, _ = padded_logprobs(policy, [prompt], [c], 1.0)
            alone[i, : lp.shape[1]] = lp[0]
        with policy.model.disable_adapter():
            base, _ = padded_logprobs(policy, [prompt] * len(ids), ids, 1.0)
    m = mask.bool()

    def seq(x):
        return (x * m).sum(1)

    return dict(
        completions=len(ids),
        tokens=int(m.sum()),
        max_abs_token=float((packed - padded)[m].abs().max()),
        mean_abs_token=float((packed - padded)[m].abs().mean()),
        max_abs_sequence=float((seq(packed) - seq(padded)).abs().max()),
        floor_max_abs_token=float((alone - padded)[m].abs().max()),
        floor_max_abs_sequence=float((seq(alone) - seq(padded)).abs().max()),
        adapter_effect_mean_abs_token=float((padded - base)[m].abs().mean()),
    )


def pass_tokens(plan, samples, packed: bool) -> int:
    """Tokens through the language model per pass (the reference pass and the gradient pass run the same)."""
    from halo_learner.memory import _chunk_shape

    total = 0
    for c in (c for g in plan.groups for c in g.chunks):
        lens = [len(x) for r in c for x in (samples[r].chosen, samples[r].rejected)]
        prompt = len(samples[c[0]].prompt)
        total += _chunk_shape(prompt, lens, True)[0] if packed else prompt + len(lens) * max(lens)
    return total


def args_smoke(policy) -> bool:
    """The CPU smoke run checkpoints every chunk (no budget there), to run the code the GPU shape takes."""
    return policy.device.type != "cuda"


def run_mode(
    policy, batches, packed: bool, budget, cap: int, warmup: int, force_checkpoint: bool = False, ranks=None
) -> dict:
    name = "packed" if packed else "padded"
    cuda = policy.device.type == "cuda"
    k, ooms, plan = cap, 0, None
    while True:
        with torch.no_grad():  # every mode and every retry starts from the same adapter
            for n, p in policy.trainable_parameters().items():
                p.copy_(policy.initial_adapter[n])
        opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        times, stats, plans = [], [], []
        try:
            for i, batch in enumerate(batches):
                plan = plan_chunks(policy, batch, k, packed, budget)
                for g in plan.groups if force_checkpoint else ():
                    if g.checkpointed or args_smoke(policy):
                        g.layers = [plan.decoder_layers] * len(g.chunks)
                if ranks is not None:  # rank 0's plan everywhere: resident memory may differ by a few MB per rank
                    from learner_ranks import broadcast

                    plan = broadcast(plan, ranks)
                plans.append(plan)
                sync(policy)
                t0 = time.perf_counter()
                st = dpo_step(policy, opt, batch, beta=0.1, max_grad_norm=1.0, packed=packed, plan=plan, ranks=ranks)
                sync(policy)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
                stats.append(st)
            break
        except torch.OutOfMemoryError as e:
            del opt
            policy.model.zero_grad(set_to_none=True)
            ooms += 1
            first = str(e).splitlines()[0] if str(e) else "out of memory"
            print(f"  {name}: out of memory at {plan.pairs_per_chunk} pair(s) per chunk ({first[:120]})", flush=True)
            if plan.pairs_per_chunk <= 1:
                if cuda:
                    torch.cuda.empty_cache()
                return dict(mode=name, result="OOM", oom_retries=ooms, budget_gib=(budget or 0) / GIB)
            k = plan.pairs_per_chunk // 2
    peak = torch.cuda.max_memory_allocated(policy.device) / GIB if cuda else None
    secs = sum(times) / len(times)
    del opt
    return dict(
        mode=name,
        result="ok",
        seconds_per_update=secs,
        peak_gib=peak,
        oom_retries=ooms,
        pairs_per_chunk=plans[-1].pairs_per_chunk,
        chunks=plans[-1].chunks,
        checkpointed_chunks=plans[-1].checkpointed,
        recomputed_layers=plans[-1].recomputed_layers,
        decoder_layers=plans[-1].decoder_layers,
        estimated_peak_gib=max(p.peak_bytes for p in plans) / GIB,
        budget_gib=(budget or 0) / GIB,
        timed_updates=len(times),
        first_loss=stats[0].loss,
        completion_tokens=stats[-1].tokens,
        tokens_per_pass=pass_tokens(plans[-1], batches[-1], packed),
    )


def fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-shape", action="store_true", help="mcts-real's shape on the GPU (the default there)")
    ap.add_argument("--smoke", action="store_true", help="tiny random model on CPU, a small batch of the same form")
    ap.add_argument("--prompts", type=int, default=16, help="prompts (search nodes) per batch")
    ap.add_argument("--pairs-per-prompt", type=int, default=4)
    ap.add_argument("--min-tokens", type=int, default=128, help="shortest completion")
    ap.add_argument("--max-tokens", type=int, default=512, help="longest completion (policy.maxTokens)")
    ap.add_argument("--text-tokens", type=int, default=160, help="text tokens of the user message")
    ap.add_argument("--cap", type=int, default=8, help="most pairs per gradient chunk (HALO_DPO_PAIRS_PER_CHUNK)")
    ap.add_argument("--steps", type=int, default=2, help="timed packed updates (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--padded-steps", type=int, default=1, help="timed padded updates (no warm-up)")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also measure packed with torch.compile'd decoder layers (HALO_COMPILE=1; compiles in its warm-up)",
    )
    ap.add_argument("--perturb", type=float, default=0.02, help="std of the perturbed LoRA B in the log-prob check")
    ap.add_argument(
        "--every-layer",
        action="store_true",
        help="also packed with every decoder layer of every checkpointed chunk recomputed (the plan before)",
    )
    ap.add_argument("--ranks", type=int, default=0, help="data-parallel over this many GPUs (0: no process group)")
    args = ap.parse_args()
    args.screenshot = (1280, 720)
    if args.smoke:
        torch.set_num_threads(2)
        args.prompts, args.pairs_per_prompt, args.min_tokens, args.max_tokens = 3, 2, 4, 16
        args.text_tokens, args.steps, args.warmup, args.screenshot = 40, 1, 0, (96, 64)
    elif not torch.cuda.is_available():
        print("--real-shape needs CUDA (or --smoke for the CPU run)", file=sys.stderr)
        return 2

    if args.ranks:
        from learner_ranks import run_ranks

        return run_ranks(args, functools.partial(measure, args), build)
    t0 = time.perf_counter()
    policy = build(args.smoke)
    print(f"model built in {time.perf_counter() - t0:.1f}s", flush=True)
    return measure(args, policy, BlobStore(tempfile.mkdtemp(prefix="halo-bench-blobs-")))


def measure(args, policy, blobs, ranks=None) -> int:
    """(a) and (b) on a built model; with `ranks`, this rank's part of the data-parallel updates."""
    cuda = policy.device.type == "cuda"
    dev = torch.cuda.get_device_name() if cuda else "CPU (smoke, tiny random model, float32)"
    total = torch.cuda.get_device_properties(policy.device).total_memory if cuda else 0
    world = f"{ranks.world} rank(s), data-parallel path" if ranks else "single process"
    print(
        f"## learner_dpo --real-shape: {dev}{f' ({total / GIB:.1f} GiB)' if cuda else ''}, torch {torch.__version__}, "
        f"{policy.dtype}, {world}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
        flush=True,
    )

    perturb_adapter(policy, args.perturb)
    check = logprob_check(policy, blobs, args)
    print(
        "| (a) packed vs. padded log-probs | tokens | max abs, token | mean abs, token | max abs, sequence "
        "| floor: padded alone vs. batched, max abs token / sequence | adapter effect |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {check['completions']} completions of one prompt, {args.min_tokens}..{args.max_tokens} tokens | "
        f"{check['tokens']} | {check['max_abs_token']:.4g} | {check['mean_abs_token']:.3g} | "
        f"{check['max_abs_sequence']:.4g} | "
        f"{check['floor_max_abs_token']:.4g} / {check['floor_max_abs_sequence']:.4g} | "
        f"{check['adapter_effect_mean_abs_token']:.3g} |\n",
        flush=True,
    )

    budget = budget_bytes(policy.device)
    if cuda:
        torch.cuda.set_per_process_memory_fraction(budget / total, policy.device)
    if ranks is not None and ranks.world > 1:
        args.padded_steps = 0  # the padded path is the single-process baseline
    batches = [make_batch(policy, blobs, args, seed=200 + s) for s in range(args.warmup + args.steps)]
    n_pairs = len(batches[0])
    print(
        f"batch: {n_pairs} pairs over {args.prompts} prompts of {len(batches[0][0].prompt)} tokens, completions "
        f"{args.min_tokens}..{args.max_tokens} tokens; budget "
        f"{f'{budget / GIB:.1f} GiB' if budget else 'none'}{' (the process is capped there)' if cuda else ''}; packed: "
        f"{args.warmup} warm-up + {args.steps} timed updates, padded: {args.padded_steps} timed\n",
        flush=True,
    )
    # Smoke: no budget on CPU, so nothing would be checkpointed; force it, to run the code the GPU shape takes.
    rows = [run_mode(policy, batches, True, budget, args.cap, args.warmup, force_checkpoint=args.smoke, ranks=ranks)]
    if args.every_layer:
        rows.append(run_mode(policy, batches, True, budget, args.cap, args.warmup, force_checkpoint=True, ranks=ranks))
        rows[-1]["mode"] = "packed, every layer checkpointed (before)"
    if args.padded_steps:
        rows.append(run_mode(policy, batches[: args.padded_steps], False, budget, args.cap, 0, ranks=ranks))
    if args.compile:
        from halo_learner.logprobs import compile_packed_layers

        t1 = time.perf_counter()
        try:
            compile_packed_layers(policy)
            rows.append(
                run_mode(policy, batches, True, budget, args.cap, args.warmup, force_checkpoint=args.smoke, ranks=ranks)
            )
            rows[-1]["mode"] = "packed, compiled layers"
            print(f"compiled mode, compile + warm-up + timed updates: {time.perf_counter() - t1:.0f}s", flush=True)
        except Exception as e:  # noqa: BLE001 - keep the eager numbers if compilation fails here
            print(f"compiled mode failed after {time.perf_counter() - t1:.0f}s: {type(e).__name__}: {e}", flush=True)
            args.compile = False

    print(
        "| (b) mode | s per update | pairs/s | peak GPU mem GiB | estimated peak GiB | OOM retries | pairs per chunk "
        "| chunks (checkpointed) | layer passes recomputed | tokens per pass | first loss |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["result"] == "OOM":
            print(f"| {r['mode']} | OOM | | | | {r['oom_retries']} | 1 | | | | |")
            continue
        print(
            f"| {r['mode']} | {r['seconds_per_update']:.2f} | {n_pairs / r['seconds_per_update']:.2f} | "
            f"{fmt(r['peak_gib'], '.1f')} | {r['estimated_peak_gib']:.1f} | {r['oom_retries']} | "
            f"{r['pairs_per_chunk']} | {r['chunks']} ({r['checkpointed_chunks']}) | "
            f"{r['recomputed_layers']} of {r['chunks'] * r['decoder_layers']} | {r['tokens_per_pass']:,} | "
            f"{r['first_loss']:.6f} |"
        )
    # Measured on the GPU at the real shape only; the smoke run says n/a (null).
    targets = {}
    for r in (r for r in rows if r["mode"].startswith("packed")):
        ok = r["result"] == "ok"
        t = targets[r["mode"]] = dict(
            no_oom_retry=ok and r["oom_retries"] == 0 if cuda else None,
            seconds_per_update_le_12=ok and r["seconds_per_update"] <= TARGET_SECONDS if cuda else None,
            peak_le_37_gib=ok and r["peak_gib"] <= TARGET_PEAK_GIB if cuda else None,
        )
        word = {True: "MET", False: "MISSED", None: "n/a (CPU)"}
        print(
            f"\ntargets, {r['mode']}: fits with no OOM retry {word[t['no_oom_retry']]}; <= {TARGET_SECONDS:.0f} s "
            f"per update {word[t['seconds_per_update_le_12']]}; peak <= {TARGET_PEAK_GIB:.0f} GiB "
            f"{word[t['peak_le_37_gib']]}",
            flush=True,
        )
    print()
    summary = dict(
        bench="learner_dpo",
        device=dev,
        torch=torch.__version__,
        shape=dict(
            pairs=n_pairs,
            prompts=args.prompts,
            prompt_tokens=len(batches[0][0].prompt),
            completion_tokens=[args.min_tokens, args.max_tokens],
        ),
        logprob_check=check,
        **{r["mode"]: r if r["result"] == "ok" else "OOM" for r in rows},
        targets=targets,
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
