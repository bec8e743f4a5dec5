"""OpenAI chat messages as vLLM 0.33 hands them to Qwen3-VL's chat template: string content as one text part (its
"openai" content format), each image_url part an image placeholder, the pictures decoded in order and loaded as vLLM
loads them (halo_learner.prompts.load_image: EXIF orientation, transparency onto white). Shared by the vLLM
stand-in's prompt encoder and the prompt-integrity test's helper, so both encode a request as vLLM does."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers" / "learner"))

from halo_learner.prompts import load_image  # noqa: E402


def template_inputs(messages):
    out, images = [], []
    for m in messages:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
        for p in [] if isinstance(content, str) else content:
            if p["type"] == "image_url":
                head, data = p["image_url"]["url"].split(",", 1)
                if not (head.startswith("data:image/") and head.endswith(";base64")):
                    raise ValueError(f"not a base64 image data URL: {head}")
                images.append(load_image(base64.b64decode(data)))
                parts.append({"type": "image"})
            elif p["type"] == "text":
                parts.append({"type": "text", "text": p["text"]})
            else:
                raise ValueError(f"unexpected content part {p['type']!r}")
        out.append({"role": m["role"], "content": parts})
    return out, images
