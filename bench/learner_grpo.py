#!/usr/bin/env python
"""GRPO learner step on the Qwen3-VL-8B architecture: plain padded batch vs. prefix-shared groups, side by side.

    .venv/bin/python bench/learner_grpo.py            # GPU: random-init 8B in bf16, real 8B shapes
    .venv/bin/python bench/learner_grpo.py --smoke    # CPU: tiny random Qwen3-VL, same code, < 1 minute
    .venv/bin/python bench/learner_grpo.py --real-shape   # GPU: the real run's shape under vLLM's leftover memory

--real-shape measures instead, on the same random 8B:
  (d) a bf16 check that the packed layout's per-token log-probs equal the padded layout's, with a perturbed
      (non-zero) adapter, for 8 completions of 30 and of 256 tokens; the noise floor next to it is the padded
      layout against itself (one row alone vs. eight rows in one batch);
  (e) configs/grpo-real.yaml's step: 8 prompts x 8 completions of up to 256 tokens (policy.maxTokens), each
      prompt a 1280x720 screenshot (880 image tokens), dr_grpo with max_completion_len 256, the chunk size
      planned by halo_learner.memory under the budget vLLM at --gpu-memory-utilization 0.5 leaves, and the
      process capped at that budget (torch.cuda.set_per_process_memory_fraction), so a wrong plan is an OOM,
      which (as in the learner) halves the chunk and tries again. The packed step runs the decoupled objective
      (--weight-cap, staleWeightCap's default 5), as served and exploring samples train; the bench's completions
      carry no sampler log-probs, so every importance weight is 1 and nothing is clipped before the step.
      --ranks K runs it through the data-parallel learner (halo_learner.distributed) on K GPUs, one process
      each, the batch sharded by prompt group; --ranks 1 is that code path on one GPU. --no-padded skips the
      padded baseline.

Everything is built locally (no download): the model from the published 8B config below with random
weights (same FLOPs and memory as the real ones), and a processor made of a locally trained byte-level
BPE tokenizer plus Qwen3-VL's image processor with the real pixel limits, so a 1280x720 screenshot becomes
880 image tokens exactly as in production.

Measured in one run, on the same model and the same batches:
  (a) baseline: the textbook transformers+peft GRPO step: every completion re-runs its full prompt
      (screenshot included) in left/right-padded micro-batches, no sharing;
  (b) ours: each group is ONE packed sequence, prompt once then all its completions, with a block
      attention mask and M-RoPE positions restarting after the prompt per completion
      (halo_learner.logprobs.packed_group_logprobs): one no-grad reference pass and one forward+backward
      per group; LoRA weights run as bf16 working copies (fp32 masters and optimiser state);
      gradients equal to (a) up to bf16 rounding (float32: relative difference ~1e-6, see the tests);
      measured eager, then (unless --no-compile) again with torch.compile'd decoder layers;
  (c) colocated generation: n completions per prompt with the shared-prefix sampler.
Both (a) and (b) do the reference (adapter-disabled) pass for the KL term, then forward+backward, then
one AdamW step on the LoRA weights (rank 16 on the 7 language-model projections).
"""

from __future__ import annotations

import argparse
import functools
import io
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workers" / "learner"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.grpo import GrpoSample, grpo_step  # noqa: E402
from halo_learner.models import LoraSettings, build_tiny_processor, special_ids, tiny_config, wrap_lora  # noqa: E402
from halo_learner.prompts import encode_prompt, prompt_key  # noqa: E402
from halo_learner.sampling import sample  # noqa: E402

# Qwen/Qwen3-VL-8B-Instruct config.json (research notes §1.2). Token ids of the special tokens are taken
# from the local tokenizer instead (same roles; the id values do not change any cost).
QWEN3_VL_8B_TEXT = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=262144,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "default",
        "mrope_interleaved": True,
        "mrope_section": [24, 20, 20],
        "rope_theta": 5000000.0,
    },
)
QWEN3_VL_8B_VISION = dict(
    depth=27,
    hidden_size=1152,
    intermediate_size=4304,
    num_heads=16,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=4096,
    num_position_embeddings=2304,
    deepstack_visual_indexes=[8, 16, 24],
    hidden_act="gelu_pytorch_tanh",
    in_channels=3,
)
# preprocessor_config.json of the Qwen3-VL family: min 256^2, max 4096^2 pixels.
QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS = 65536, 16777216

SYSTEM = (
    "You are a web agent. You see a screenshot of a browser page, its accessibility tree and a goal. "
    "Choose exactly one next action and answer with exactly one tool call in this format: <tool_call> "
    '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}} </tool_call>'
)


def build(smoke: bool, device: torch.device | None = None):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    if smoke:
        processor = build_tiny_processor()
        cfg = tiny_config(processor.tokenizer)
        device, dtype = torch.device("cpu"), torch.float32
    else:
        processor = build_tiny_processor(QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS, vocab_size=4000)
        ids = special_ids(processor.tokenizer)
        cfg = Qwen3VLConfig(
            text_config=dict(QWEN3_VL_8B_TEXT, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"]),
            vision_config=QWEN3_VL_8B_VISION,
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=False,
        )
        device, dtype = device or torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        base = Qwen3VLForConditionalGeneration._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    policy = wrap_lora(
        base,
        processor,
        model_id="qwen3-vl-8b-random" if not smoke else "tiny-random",
        lora=LoraSettings(rank=16, alpha=32),
        device=device,
        dtype=dtype,
    )
    return policy


def screenshot_ref(blobs: BlobStore, w: int, h: int, seed: int) -> str:
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    arr = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return blobs.put(buf.getvalue(), "png")


def user_text(tokenizer, target_tokens: int, seed: int) -> str:
    rnd = random.Random(seed)
    roles = ["button", "link", "textbox", "checkbox", "heading", "combobox"]
    lines = [
        f"Goal: complete form {seed} and press Submit",
        "URL: http://localhost/miniwob/form.html",
        "Step: 3",
        "",
        "Accessibility tree:",
    ]
    text = ""
    for i in range(400):
        lines.append(
            f'[{i}] {rnd.choice(roles)} "item {rnd.randrange(1000)}" @({rnd.randrange(1000)},{rnd.randrange(1000)})'
        )
        candidate = "\n".join(lines + ["", "Previous actions: none", "", "What is the next action?"])
        if len(tokenizer(candidate)["input_ids"]) > target_tokens:
            break
        text = candidate
    return text


def make_batch(policy, blobs, groups: int, group_size: int, completion_len: int, text_tokens: int, seed: int):
    rnd = random.Random(seed)
    vocab = policy.model.base_model.model.config.text_config.vocab_size
    samples = []
    for g in range(groups):
        m = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {
                "role": "user",
                "content": [
                    {"type": "image", "ref": screenshot_ref(blobs, 1280, 720, seed * 100 + g)},
                    {"type": "text", "text": user_text(policy.tokenizer, text_tokens, g)},
                ],
            },
        ]
        prompt = encode_prompt(policy.processor, m, blobs)
        rewards = [rnd.random() for _ in range(group_size)]
        mean = sum(rewards) / group_size
        for r in rewards:
            n = rnd.randint(completion_len - 5, completion_len + 5)
            ids = [rnd.randrange(10, vocab) for _ in range(n)]
            samples.append(
                GrpoSample(prompt=prompt, prompt_key=prompt_key(m), ids=ids, advantage=r - mean, old_logprobs=None)
            )
    return samples


def sync(policy):
    if policy.device.type == "cuda":
        torch.cuda.synchronize()


def run_mode(policy, batches, prefix_sharing: bool, micro_batch: int, warmup: int):
    with torch.no_grad():  # both modes start from the same (fresh) adapter
        for name, p in policy.trainable_parameters().items():
            p.copy_(policy.initial_adapter[name])
    opt = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-6, weight_decay=0.0)
    if policy.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i, batch in enumerate(batches):
        sync(policy)
        t0 = time.perf_counter()
        st = grpo_step(
            policy,
            opt,
            batch,
            clip_epsilon=0.2,
            kl_coef=0.001,
            temperature=0.7,
            max_grad_norm=1.0,
            max_completion_len=None,
            micro_batch=micro_batch,
            prefix_sharing=prefix_sharing,
        )
        sync(policy)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(st.loss)
    peak = torch.cuda.max_memory_allocated() / 2**30 if policy.device.type == "cuda" else float("nan")
    del opt
    return sum(times) / len(times), peak, losses


def perturb_adapter(policy, scale: float, seed: int = 3) -> None:
    """LoRA B away from zero, so the adapter changes the log-probs the check compares."""
    g = torch.Generator(device=policy.device).manual_seed(seed)
    with torch.no_grad():
        for n, p in policy.trainable_parameters().items():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g, device=policy.device, dtype=p.dtype) * scale)


def logprob_check(policy, blobs, completion_len: int, text_tokens: int, group_size: int = 8) -> dict:
    """Per-token log-probs of one group, packed vs. padded (both with the perturbed adapter, temperature 0.7)."""
    from halo_learner.logprobs import packed_group_logprobs, padded_logprobs

    batch = make_batch(policy, blobs, 1, group_size, completion_len, text_tokens, seed=77 + completion_len)
    prompt, ids = batch[0].prompt, [s.ids for s in batch]
    T = 0.7
    with torch.no_grad():
        packed, mask = packed_group_logprobs(policy, prompt, ids, T)
        padded, _ = padded_logprobs(policy, [prompt] * len(ids), ids, T)
        alone = torch.zeros_like(padded)
        for i, c in enumerate(ids):
            lp, _ = padded_logprobs(policy, [prompt], [c], T)
            alone[i, : lp.shape[1]] = lp[0]
        with policy.model.disable_adapter():
            base, _ = padded_logprobs(policy, [prompt] * len(ids), ids, T)
    m = mask.bool()
    d = (packed - padded)[m].abs()
    floor = (alone - padded)[m].abs()
    moved = (padded - base)[m].abs()
    return dict(
        completion_len=completion_len,
        tokens=int(m.sum()),
        max_abs=float(d.max()),
        mean_abs=float(d.mean()),
        floor_max=float(floor.max()),
        floor_mean=float(floor.mean()),
        adapter_effect=float(moved.mean()),
    )


def real_shape(args, policy, blobs, ranks=None) -> int:
    """(d) the bf16 log-prob check, then (e) the real config's step under the memory budget."""
    from halo_learner.memory import GIB, LOGIT_BYTES, MemoryModel, _chunk_shape, budget_bytes, plan_micro_batch

    cuda = policy.device.type == "cuda"
    dev = torch.cuda.get_device_name() if cuda else "CPU (smoke, tiny random model)"
    total = torch.cuda.get_device_properties(policy.device).total_memory if cuda else 0
    world = f"{ranks.world} rank(s), data-parallel path" if ranks else "single process"
    print(
        f"\n## learner_grpo --real-shape: {dev} ({total / GIB:.1f} GiB), torch {torch.__version__}, {world}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n",
        flush=True,
    )
    perturb_adapter(policy, args.perturb)
    if ranks is not None and ranks.world > 1:  # every rank computes it, rank 0 prints it; keep the ranks in step
        args.no_padded = True
    print(
        "| (d) bf16 packed vs. padded | tokens | max abs diff | mean abs diff | padded alone vs. batched: max | "
        "mean | mean abs adapter effect |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (30, 256):
        r = logprob_check(policy, blobs, n, args.text_tokens)
        print(
            f"| 8 completions of ~{n} tokens | {r['tokens']} | {r['max_abs']:.4f} | {r['mean_abs']:.5f} | "
            f"{r['floor_max']:.4f} | {r['floor_mean']:.5f} | {r['adapter_effect']:.4f} |",
            flush=True,
        )

    budget = budget_bytes(policy.device)
    if cuda:
        torch.cuda.set_per_process_memory_fraction(budget / total, policy.device)
    groups, size, max_len = 8, 8, args.max_tokens
    rnd = random.Random(5)
    batches = []
    for s in range(args.warmup + args.steps):
        b = make_batch(policy, blobs, groups, size, max_len, args.text_tokens, seed=200 + s)
        for smp in b:  # lengths spread over 1..maxTokens, as sampled completions are
            smp.ids = smp.ids[: rnd.randint(max_len // 4, max_len)]
        batches.append(b)
    print(
        f"\nbudget {(budget or 0) / GIB:.1f} GiB (what vLLM at --gpu-memory-utilization 0.5 leaves; the process is "
        f"capped there); per step {groups} prompts x {size} completions, prompt {len(batches[0][0].prompt)} "
        f"tokens, completions {max_len // 4}..{max_len} tokens, kl_coef 0.001, max_completion_len {max_len}\n"
    )
    print(
        "| (e) mode | chunk (planned) | estimated peak GiB | step s | completions/s | completion tokens/s | "
        "peak GPU mem GiB | OOM retries | activation bytes/token measured (model) | loss (first, last) | "
        "clip fraction | capped |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for packed in (True, False) if not args.no_padded else (True,):
        shape = (
            [
                (len(b.prompt), [len(s.ids) for s in batches[0][i * size : (i + 1) * size]])
                for i, b in enumerate(batches[0][::size])
            ]
            if packed
            else [(len(s.prompt), [len(s.ids)]) for s in batches[0]]
        )
        mm = MemoryModel.from_policy(policy, packed)
        plan = plan_micro_batch(shape, size, budget, mm, packed)
        k, ooms = plan.micro_batch, 0
        if ranks is not None:  # rank 0's plan for every rank: resident memory may differ by a few MB between them
            from learner_ranks import broadcast

            k = broadcast(k, ranks)
        while True:
            try:
                opt = torch.optim.AdamW(
                    [p for p in policy.model.parameters() if p.requires_grad], lr=1e-5, weight_decay=0.0
                )
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                times, ctoks, stats = [], 0, []
                for i, batch in enumerate(batches if packed else batches[: args.warmup + 1]):
                    sync(policy)
                    t0 = time.perf_counter()
                    st = grpo_step(
                        policy,
                        opt,
                        batch,
                        clip_epsilon=0.2,
                        kl_coef=0.001,
                        temperature=0.7,
                        max_grad_norm=1.0,
                        max_completion_len=max_len,
                        micro_batch=k,
                        prefix_sharing=packed,
                        weight_cap=args.weight_cap if packed else None,
                        ranks=ranks,
                    )
                    sync(policy)
                    stats.append(st)
                    if i >= args.warmup:
                        times.append(time.perf_counter() - t0)
                        ctoks += sum(len(s.ids) for s in batch)
                break
            except torch.OutOfMemoryError:
                del opt
                ooms += 1
                if k == 1:
                    print(f"| {'packed' if packed else 'padded'} | 1 | OOM at one completion per chunk |")
                    k = 0
                    break
                k //= 2
        if not k:
            continue
        step = sum(times) / len(times)
        n = groups * size
        # Invert the memory model on the measured peak: what one token of the largest chunk really kept.
        chunks = []
        for bt in batches if packed else batches[: args.warmup + 1]:
            if packed:
                chunks += [
                    (len(bt[i * size].prompt), [len(x.ids) for x in bt[i * size : (i + 1) * size][j : j + k]])
                    for i in range(groups)
                    for j in range(0, size, k)
                ]
            else:
                chunks += [
                    (max(len(x.prompt) for x in bt[j : j + k]), [len(x.ids) for x in bt[j : j + k]])
                    for j in range(0, len(bt), k)
                ]
        worst = max((_chunk_shape(p_len, lens, packed) for p_len, lens in chunks), key=lambda t: t[0])
        peak = torch.cuda.max_memory_allocated() if cuda else 0
        measured = (peak - mm.resident_bytes - LOGIT_BYTES * worst[1] * mm.vocab) / worst[0] if cuda else float("nan")
        print(
            f"| {'packed groups' if packed else 'padded baseline'} | {k} ({plan.micro_batch}) | "
            f"{plan.peak_bytes / GIB:.1f} | {step:.2f} | {n / step:.2f} | {ctoks / len(times) / step:,.0f} | "
            f"{peak / GIB if cuda else float('nan'):.1f} | {ooms} | {measured:,.0f} ({mm.act_bytes_per_token:,.0f}) | "
            f"{stats[0].loss:.6f}, {stats[-1].loss:.6f} | {stats[-1].ratios.clip_fraction:.3f} "
            f"({stats[-1].ratios.tokens} tokens) | "
            f"{stats[-1].ratios.capped_fraction if packed else float('nan'):.3f} |",
            flush=True,
        )
        del opt
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny random model on CPU, a few seconds")
    ap.add_argument("--groups", type=int, default=2, help="prompts (screenshots) per GRPO step")
    ap.add_argument("--group-size", type=int, default=8, help="completions per prompt (N)")
    ap.add_argument("--completion-len", type=int, default=30)
    ap.add_argument("--text-tokens", type=int, default=160, help="text tokens of the user message")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode (after --warmup)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--baseline-micro-batch",
        type=int,
        default=4,
        help="sequences per forward in the padded baseline (4 is the most an H100 fits unshared)",
    )
    ap.add_argument("--gen-tokens", type=int, default=30)
    ap.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure (b) with torch.compile'd decoder layers (compiles in the warm-up step)",
    )
    ap.add_argument(
        "--real-shape",
        action="store_true",
        help="the bf16 packed-vs-padded check and the real config's step under the memory budget",
    )
    ap.add_argument("--max-tokens", type=int, default=256, help="--real-shape: policy.maxTokens")
    ap.add_argument("--perturb", type=float, default=0.02, help="--real-shape: std of the perturbed LoRA B")
    ap.add_argument("--weight-cap", type=float, default=5.0, help="--real-shape: the decoupled objective's cap")
    ap.add_argument("--no-padded", action="store_true", help="--real-shape: skip the padded baseline")
    ap.add_argument(
        "--ranks", type=int, default=0, help="--real-shape: data-parallel over this many GPUs (0: no process group)"
    )
    args = ap.parse_args()
    if args.real_shape and not torch.cuda.is_available() and not args.smoke:
        print("--real-shape needs CUDA (or --smoke for the CPU dry run)", file=sys.stderr)
        return 2
    if args.smoke:
        torch.set_num_threads(2)
        args.steps, args.warmup, args.groups, args.text_tokens = 2, 1, 2, 60
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --smoke for the CPU smoke test", file=sys.stderr)
        return 2

    if args.real_shape:
        args.steps = min(args.steps, 2)
        if args.smoke:
            args.max_tokens, args.steps = 16, 1
        if args.ranks:
            from learner_ranks import run_ranks

            return run_ranks(args, functools.partial(real_shape, args), build)
    t0 = time.perf_counter()
    policy = build(args.smoke)
    build_s = time.perf_counter() - t0
    blobs = BlobStore(tempfile.mkdtemp(prefix="halo-bench-blobs-"))
    print(f"model built in {build_s:.1f}s", flush=True)
    if args.real_shape:
        return real_shape(args, policy, blobs)
    batches = [
        make_batch(policy, blobs, args.groups, args.group_size, args.completion_len, args.text_tokens, s)
        for s in range(args.warmup + args.steps)
    ]
    prompt_tokens = len(batches[0][0].prompt)
    image_id = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    image_tokens = int((batches[0][0].prompt.input_ids == image_id).sum())
    completions = len(batches[0])
    comp_tokens = sum(len(s.ids) for b in batches[args.warmup :] for s in b) / args.steps
    seq_tokens = sum(len(s.prompt) + len(s.ids) for b in batches[args.warmup :] for s in b) / args.steps

    base_s, base_peak, base_losses = run_mode(policy, batches, False, args.baseline_micro_batch, args.warmup)
    ours_s, ours_peak, ours_losses = run_mode(policy, batches, True, args.group_size, args.warmup)
    rows = [
        (f"(a) padded baseline, micro-batch {args.baseline_micro_batch}", base_s, base_peak, base_losses),
        (f"(b) packed groups, chunk {args.group_size}, eager", ours_s, ours_peak, ours_losses),
    ]
    dev = torch.cuda.get_device_name() if policy.device.type == "cuda" else "CPU (smoke, tiny random model)"
    header = (
        f"\n## learner_grpo: {dev}, torch {torch.__version__}, {policy.dtype}".replace("torch.", "")
        + f"\n\nmodel built in {build_s:.1f}s; per step: {args.groups} prompts x {args.group_size} completions = "
        f"{completions} completions; prompt {prompt_tokens} tokens ({image_tokens} image tokens); "
        f"completions ~{args.completion_len} tokens; LoRA r=16 on q,k,v,o,gate,up,down; kl_coef 0.001 "
        f"(reference pass included); {args.steps} timed steps after {args.warmup} warm-up\n"
    )

    def table():
        print(header)
        print(
            "| mode | step s | completions/s | sequence tokens/s | completion tokens/s | peak GPU mem GiB | "
            "speed vs (a) | first-step loss |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, s, peak, losses in rows:
            print(
                f"| {name} | {s:.3f} | {completions / s:.2f} | {seq_tokens / s:,.0f} | {comp_tokens / s:,.0f} | "
                f"{peak:.1f} | {base_s / s:.2f}x | {losses[0]:.6f} |"
            )
        print("\ntargets for (b): >= 5x the completions/s of (a), peak <= 32 GiB\n", flush=True)

    table()
    if args.compile:
        from halo_learner.logprobs import compile_packed_layers

        t1 = time.perf_counter()
        try:
            compile_packed_layers(policy)
            # The warm-up step (not timed) compiles; dynamic lengths, so later groups do not recompile.
            c_s, c_peak, c_losses = run_mode(policy, batches, True, args.group_size, args.warmup)
            rows.append((f"(b) packed groups, chunk {args.group_size}, compiled decoder layers", c_s, c_peak, c_losses))
            print(f"compiled mode total (compile + warm-up + timed steps): {time.perf_counter() - t1:.1f}s")
        except Exception as e:  # noqa: BLE001 - keep the eager numbers if compilation fails on this machine
            print(f"compiled mode failed after {time.perf_counter() - t1:.1f}s: {type(e).__name__}: {e}")
        table()

    # (c) colocated generation, n = group size, prefill shared.
    prompt = batches[0][0].prompt
    if policy.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sample(policy, prompt, args.group_size, 1.0, 4, seed=0)  # warm-up
    sync(policy)
    t1 = time.perf_counter()
    gen_rounds = 1 if args.smoke else 3
    gen_tokens = 0
    for r in range(gen_rounds):
        out = sample(policy, prompt, args.group_size, 1.0, args.gen_tokens, seed=r + 1)
        gen_tokens += sum(len(c.token_ids) for c in out)
    sync(policy)
    gen_s = (time.perf_counter() - t1) / gen_rounds
    gen_peak = torch.cuda.max_memory_allocated() / 2**30 if policy.device.type == "cuda" else float("nan")

    print(
        "\n| (c) colocated generation | n | new tokens/completion | s per prompt | completions/s | "
        "generated tokens/s | peak GPU mem GiB |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| shared-prefix sampler | {args.group_size} | {gen_tokens / gen_rounds / args.group_size:.0f} | "
        f"{gen_s:.3f} | {args.group_size / gen_s:.2f} | {gen_tokens / gen_rounds / gen_s:,.0f} | {gen_peak:.1f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
