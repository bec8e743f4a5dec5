#!/usr/bin/env python
"""Pixel agreement: Qwen3-VL's torchvision image processor (what vLLM 0.33 runs) against the PIL one (what the
learner falls back to without torchvision), on a folder of real screenshots.

    python bench/pixel_agreement.py [DIR] [--json OUT]        # default DIR: bench/screens

Standalone: torch, torchvision and transformers only; no network and no model download. Both processors are built
from Qwen/Qwen3-VL-8B-Instruct's preprocessor_config.json values (patch 16, temporal patch 2, merge 2, 65536 ..
16777216 pixels, mean/std 0.5, bicubic), and every screenshot is loaded as vLLM 0.33 loads it
(vllm/multimodal/image.py: EXIF orientation, transparency composited onto white), as the learner does too
(halo_learner/prompts.py load_image). For each screenshot it prints both grids (image_grid_thw), both image token
counts (grid / merge^2: they must agree, or the prompt ids differ) and the max / mean |pixel_values difference| in
normalised units (one 8-bit level is 2/255 = 0.0078 there), then the totals; the last line is one JSON object.
bench/capture-screens.ts saves the screenshots (MiniWoB++ pages and the REAL stand-in, 1280x720). Without
torchvision only the PIL processor runs, and the output says so.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from PIL import Image, ImageOps

# Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json, the fields the image processors read.
QWEN3_VL_PREPROCESSOR = dict(
    size={"shortest_edge": 65536, "longest_edge": 16777216},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    image_mean=[0.5, 0.5, 0.5],
    image_std=[0.5, 0.5, 0.5],
)
LEVEL = 2 / 255  # one 8-bit level after rescale (1/255) and normalise (std 0.5)


def load_like_vllm(data: bytes) -> Image.Image:
    """vLLM 0.33's `normalize_image` then `convert_image_mode(image, "RGB")`."""
    with Image.open(io.BytesIO(data)) as im:
        try:
            im = ImageOps.exif_transpose(im)
        except Exception:  # noqa: BLE001 - vLLM suppresses any EXIF failure and keeps the image
            pass
        if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
            rgba = im.convert("RGBA")
            out = Image.new("RGB", rgba.size, (255, 255, 255))
            out.paste(rgba, mask=rgba.split()[3])
            return out
        return im.convert("RGB")


def processors():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.utils import is_torchvision_available

    slow = Qwen2VLImageProcessorPil(**QWEN3_VL_PREPROCESSOR)
    if not is_torchvision_available():
        return slow, None
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    return slow, Qwen2VLImageProcessor(**QWEN3_VL_PREPROCESSOR)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=str(Path(__file__).resolve().parent / "screens"))
    ap.add_argument("--json", help="also write the JSON summary here")
    a = ap.parse_args()
    files = sorted(Path(a.dir).glob("*.png"))
    if not files:
        print(f"no *.png in {a.dir}: run `node --import tsx bench/capture-screens.ts {a.dir}` first", file=sys.stderr)
        return 2
    import torch
    import transformers

    slow, fast = processors()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if fast is None:
        print("torchvision not installed: only the PIL processor ran (grids and token counts, no comparison)")
    else:
        import torchvision

        versions["torchvision"] = torchvision.__version__
    print(" ".join(f"{k} {v}" for k, v in versions.items()))
    merge = QWEN3_VL_PREPROCESSOR["merge_size"] ** 2
    rows = []
    for f in files:
        image = load_like_vllm(f.read_bytes())
        s = slow(images=[image], return_tensors="pt")
        row = {
            "file": f.name,
            "size": list(image.size),
            "grid_pil": s["image_grid_thw"][0].tolist(),
            "tokens_pil": int(s["image_grid_thw"].prod(-1).sum()) // merge,
        }
        if fast is not None:
            t = fast(images=[image], return_tensors="pt")
            row["grid_torchvision"] = t["image_grid_thw"][0].tolist()
            row["tokens_torchvision"] = int(t["image_grid_thw"].prod(-1).sum()) // merge
            row["grid_agrees"] = row["grid_torchvision"] == row["grid_pil"]
            if t["pixel_values"].shape == s["pixel_values"].shape:
                d = (t["pixel_values"].float() - s["pixel_values"].float()).abs()
                row["max_abs_diff"] = d.max().item()
                row["mean_abs_diff"] = d.mean().item()
                row["share_differing"] = (d > LEVEL / 2).float().mean().item()
        rows.append(row)
        line = f"{f.name}: {row['size'][0]}x{row['size'][1]} grid {row['grid_pil']} ({row['tokens_pil']} tokens, PIL)"
        if fast is not None:
            line += f", {row['grid_torchvision']} ({row['tokens_torchvision']}, torchvision)"
            if "max_abs_diff" in row:
                line += (
                    f"; |diff| max {row['max_abs_diff']:.4f} ({row['max_abs_diff'] / LEVEL:.1f} levels) "
                    f"mean {row['mean_abs_diff']:.2e}, {row['share_differing']:.1e} of values differ"
                )
            else:
                line += "; pixel_values shapes differ"
        print(line)
    summary = {"images": len(rows), "versions": versions, "rows": rows}
    if fast is not None:
        compared = [r for r in rows if "max_abs_diff" in r]
        summary["grids_agree"] = sum(r["grid_agrees"] for r in rows)
        summary["tokens_agree"] = sum(r["tokens_pil"] == r["tokens_torchvision"] for r in rows)
        summary["max_abs_diff"] = max((r["max_abs_diff"] for r in compared), default=None)
        summary["mean_abs_diff"] = sum(r["mean_abs_diff"] for r in compared) / len(compared) if compared else None
        print(
            f"{summary['grids_agree']}/{len(rows)} grids and {summary['tokens_agree']}/{len(rows)} image token counts "
            f"agree; |pixel_values difference| max {summary['max_abs_diff']}, mean over images {summary['mean_abs_diff']}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
