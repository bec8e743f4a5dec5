#!/usr/bin/env python
"""Prompt fidelity: the image processor vLLM uses against the one the learner falls back to, on one screenshot.

    PYTHONPATH=workers/learner python3 bench/prompt_pixels.py                     # generated 1280x720 page
    PYTHONPATH=workers/learner python3 bench/prompt_pixels.py --png shot.png      # a real screenshot

vLLM's Qwen3-VL processing runs transformers' torchvision-backed image processor (`Qwen2VLImageProcessor`); the
learner uses it too when torchvision is installed, and the PIL one (`Qwen2VLImageProcessorPil`) otherwise
(halo_learner/models.py load_processor). Both resize with smart_resize to the same grid, but resample and
normalise differently, so the same screenshot can reach the vision tower as slightly different pixels: the
learner would then score log-probs of a prompt the sampler never saw. This measures, with Qwen3-VL's pixel limits
(patch 16, merge 2, 65536..16777216 pixels, mean/std 0.5):

  - image_grid_thw and the number of image tokens of each processor (they must agree, or the prompt ids differ);
  - max / mean |pixel_values difference|, in normalised units;
  - with the seeded tiny-random Qwen3-VL (the tests' model, adapter at v0), the per-token log-ratio of one
    completion under the two pixel tensors: max and mean |log p_tv - log p_pil|, and the sequence sum's.

Without torchvision (the CPU box here) only the PIL path is measured, and the output says so. The last line of
output is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "workers" / "learner"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.logprobs import padded_logprobs  # noqa: E402
from halo_learner.models import TINY, assemble_processor, ensure_tiny_random, load_policy  # noqa: E402
from halo_learner.prompts import encode_prompt  # noqa: E402

QWEN3_VL_MIN_PIXELS, QWEN3_VL_MAX_PIXELS = 65536, 16777216
COMPLETION = (
    '<tool_call> {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}} </tool_call>'
)


def screenshot_png(width: int = 1280, height: int = 720) -> bytes:
    """A deterministic page: header bar, text lines, bordered buttons and form fields, a photo-like gradient
    block. Sharp edges and small text are what resampling filters treat differently."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (width, height), (255, 255, 255))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, width, 56], fill=(32, 60, 120))
    d.text((16, 18), "HALO test page - Book a flight", fill=(255, 255, 255))
    for i in range(24):
        y = 80 + i * 22
        d.text(
            (24, y),
            f"Line {i}: the quick brown fox jumps over the lazy dog 0123456789 {i * 37 % 101}",
            fill=(20, 20, 20),
        )
    for j, label in enumerate(("Submit", "Cancel", "Next >", "OK")):
        x = 760 + (j % 2) * 220
        y = 120 + (j // 2) * 70
        d.rectangle([x, y, x + 180, y + 44], outline=(0, 0, 0), width=2, fill=(230, 230, 240))
        d.text((x + 60, y + 15), label, fill=(0, 0, 0))
    for k in range(4):
        y = 300 + k * 50
        d.text((760, y + 10), f"Field {k}", fill=(60, 60, 60))
        d.rectangle([840, y, 1240, y + 36], outline=(120, 120, 120), width=1)
    g = torch.linspace(0, 1, 256)
    block = torch.stack(
        [g.outer(torch.ones(160)), torch.ones(256).outer(torch.linspace(0, 1, 160)), 0.5 * torch.ones(256, 160)], -1
    )
    im.paste(Image.fromarray((block * 255).to(torch.uint8).numpy()), (760, 520))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def image_processors(path: str) -> dict[str, object]:
    """The PIL processor, and the torchvision one when torchvision is installed, both at Qwen3-VL's pixel limits."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.utils import is_torchvision_available

    size = {"shortest_edge": QWEN3_VL_MIN_PIXELS, "longest_edge": QWEN3_VL_MAX_PIXELS}
    out = {"pil": Qwen2VLImageProcessorPil.from_pretrained(path, size=size)}
    if is_torchvision_available():
        from transformers import Qwen2VLImageProcessor

        out["torchvision"] = Qwen2VLImageProcessor.from_pretrained(path, size=size)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png", type=Path, help="a screenshot (default: a generated 1280x720 page)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args()

    png = args.png.read_bytes() if args.png else screenshot_png()
    dtype = getattr(torch, args.dtype)
    policy = load_policy(TINY, dtype=dtype)
    tiny_path = str(ensure_tiny_random())
    blobs = BlobStore(Path(tempfile.mkdtemp(prefix="prompt-pixels-")))
    ref = blobs.put(png, "png")
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are a web agent. Answer with one tool call."}]},
        {"role": "user", "content": [{"type": "image", "ref": ref}, {"type": "text", "text": "Goal: press Submit"}]},
    ]
    tok = policy.tokenizer
    ids = tok(COMPLETION, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    chat_template = policy.processor.chat_template

    result: dict = {"device": str(policy.device), "dtype": args.dtype, "completion_tokens": len(ids)}
    enc, lps = {}, {}
    for name, ip in image_processors(tiny_path).items():
        processor = assemble_processor(tok, ip, chat_template, tiny_path)
        enc[name] = e = encode_prompt(processor, messages, blobs)
        with torch.no_grad(), policy.model.disable_adapter():
            lps[name] = padded_logprobs(policy, [e], [ids], args.temperature)[0][0].float().cpu()
        image_tokens = int((e.mm_token_type_ids == 1).sum()) or int((e.input_ids == processor.image_token_id).sum())
        result[name] = dict(
            grid_thw=e.image_grid_thw.tolist(),
            image_tokens=image_tokens,
            prompt_tokens=len(e),
            pixel_rows=int(e.pixel_values.shape[0]),
            logprob_sum=float(lps[name].sum()),
        )
        print(f"{name:12s} grid {result[name]['grid_thw']} image tokens {image_tokens} prompt tokens {len(e)}")

    if "torchvision" not in enc:
        result["torchvision"] = None
        print("torchvision not installed: only the PIL path measured")
        print(json.dumps(result))
        return

    a, b = enc["pil"], enc["torchvision"]
    same_ids = torch.equal(a.input_ids, b.input_ids)
    result["same_prompt_ids"] = same_ids
    result["same_grid"] = torch.equal(a.image_grid_thw, b.image_grid_thw)
    if a.pixel_values.shape == b.pixel_values.shape:
        diff = (a.pixel_values.float() - b.pixel_values.float()).abs()
        result["pixel_max_abs_diff"] = float(diff.max())
        result["pixel_mean_abs_diff"] = float(diff.mean())
    if same_ids:
        lr = lps["torchvision"] - lps["pil"]
        result["log_ratio_max_abs"] = float(lr.abs().max())
        result["log_ratio_mean_abs"] = float(lr.abs().mean())
        result["sequence_log_ratio"] = float(lr.sum())
    print(
        f"same prompt ids {same_ids}, same grid {result['same_grid']}; |pixel diff| max "
        f"{result.get('pixel_max_abs_diff', float('nan')):.4f} mean {result.get('pixel_mean_abs_diff', float('nan')):.5f}; "
        f"|log ratio| per token max {result.get('log_ratio_max_abs', float('nan')):.2e} "
        f"mean {result.get('log_ratio_mean_abs', float('nan')):.2e}, sequence {result.get('sequence_log_ratio', float('nan')):.2e}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
