"""The token ids of one prompt on both sampling paths, for test/integration/prompt-integrity.test.ts.

stdin: a JSON list of {"messages": <the OpenAI-format messages a vLLM server received, images as data URLs>,
"prompt_ref": <the prompt blob the learner is given for the same step>}. For each pair it encodes
  - vllm: the messages the way vLLM serves Qwen3-VL: the processor's chat template over the messages with each
    image as a placeholder, then processor(text, images). No neutralising of its own: vLLM takes the text as sent;
  - learner: the blob through halo_learner.prompts.encode_prompt, as sample_actions and the updates do;
with the processor of the model HALO_MODEL names (default tiny-random, built under $HALO_HOME/models once; blobs
under $HALO_HOME/blobs). Prints one JSON object: {"pairs": [{"vllm": side, "learner": side}], "added": {token: id},
"merge_size": n}, a side being {"ids", "image_grid_thw"} or {"error"} when encoding raised.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers" / "learner"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))


from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.models import load_processor, resolve_model_path  # noqa: E402
from halo_learner.paths import blob_root  # noqa: E402
from halo_learner.prompts import encode_prompt  # noqa: E402
from vllm_chat import template_inputs  # noqa: E402


def side(encode):
    # Anything raised is the answer (StopIteration from the processor included), not a crash of the helper.
    try:
        ids, grid = encode()
    except BaseException as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}
    return {"ids": [int(i) for i in ids], "image_grid_thw": grid.tolist() if grid is not None else []}


def encode_vllm(processor, messages):
    template_messages, images = template_inputs(messages)
    text = processor.apply_chat_template(template_messages, tokenize=False, add_generation_prompt=True)
    enc = processor(text=[text], images=images or None, return_tensors="pt")
    return enc["input_ids"][0], enc.get("image_grid_thw")


def encode_learner(processor, blobs, prompt_ref):
    enc = encode_prompt(processor, blobs.get_json(prompt_ref), blobs)
    return enc.input_ids, enc.image_grid_thw


def main():
    pairs = json.load(sys.stdin)
    processor = load_processor(resolve_model_path(os.environ.get("HALO_MODEL") or "tiny-random"))
    blobs = BlobStore(blob_root())
    out = [
        {
            "vllm": side(lambda p=p: encode_vllm(processor, p["messages"])),
            "learner": side(lambda p=p: encode_learner(processor, blobs, p["prompt_ref"])),
        }
        for p in pairs
    ]
    print(
        json.dumps(
            {
                "pairs": out,
                "added": processor.tokenizer.get_added_vocab(),
                "merge_size": int(getattr(processor.image_processor, "merge_size", 2)),
            }
        )
    )


if __name__ == "__main__":
    main()
