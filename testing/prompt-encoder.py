"""The vLLM stand-in's `prompt_token_ids` for a model it was given (testing/fake-vllm-server.ts with `tokenizer`):
a chat request's messages encoded the way vLLM serves Qwen3-VL, with that model's own processor: the chat template
over the messages (string content as one text part, each image_url part an image placeholder), then
processor(text, images), the pictures loaded as vLLM 0.33 loads them (halo_learner.prompts.load_image).

    prompt-encoder.py MODEL_DIR      (a folder with the tokenizer, chat template and preprocessor config)

One JSON request per line on stdin, one JSON answer per line on stdout:
  {"messages": [...]} -> {"ids": [...]} or {"error": <why>};  {"ping": true} -> {"ready": true}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers" / "learner"))

from halo_learner.models import load_processor  # noqa: E402
from vllm_chat import template_inputs  # noqa: E402  (this script's folder is on the path)


def main() -> None:
    processor = load_processor(sys.argv[1])
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("ping"):
                answer = {"ready": True}
            else:
                messages, images = template_inputs(req["messages"])
                text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                enc = processor(text=[text], images=images or None, return_tensors="pt")
                answer = {"ids": [int(i) for i in enc["input_ids"][0]]}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the stand-in, which answers with it
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
