"""From the TS prompt format (messages with blob-referenced images) to model inputs, through the processor's
own chat template, so sampling and training tokenise a prompt the same way."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import torch
from PIL import Image, ImageOps

from .blobs import BlobStore
from .prompt_text import PromptStructureError, check_structure, neutralise, tokens_for


@dataclass
class EncodedPrompt:
    """One prompt, unpadded: everything the model needs to run it, on CPU until a forward pass moves it."""

    input_ids: torch.Tensor  # (P,)
    mm_token_type_ids: torch.Tensor  # (P,) 0 text, 1 image
    pixel_values: torch.Tensor | None  # (rows, patch_dim): rows = image_grid_thw.prod(-1).sum()
    image_grid_thw: torch.Tensor | None  # (n_images, 3)
    text: str

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def prompt_key(messages) -> str:
    """Identity of a prompt, for grouping items that share one (a GRPO group) and for caching encodings."""
    plain = [m.model_dump() if hasattr(m, "model_dump") else m for m in messages]
    return json.dumps(plain, sort_keys=True, separators=(",", ":"))


def load_image(data: bytes) -> Image.Image:
    """A screenshot as vLLM 0.33 hands it to the image processor (`vllm/multimodal/image.py`: `normalize_image`,
    then `convert_image_mode(image, "RGB")`): EXIF orientation applied, and transparency (RGBA, LA, PA, or a tRNS
    chunk) composited onto white. PIL's plain `convert("RGB")` would drop alpha instead, so a transparent pixel
    would reach the learner as whatever colour it stores (black, usually) and the server as white."""
    with Image.open(io.BytesIO(data)) as im:
        try:
            im = ImageOps.exif_transpose(im)
        except Exception:  # noqa: BLE001 - vLLM suppresses any EXIF failure too and keeps the image as it is
            pass
        if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
            rgba = im.convert("RGBA")
            out = Image.new("RGB", rgba.size, (255, 255, 255))
            out.paste(rgba, mask=rgba.split()[3])
            return out
        return im.convert("RGB")


def to_template_messages(
    messages, blobs: BlobStore | None, tokens: tuple[str, ...] = (), empty_user_text: bool = False
) -> tuple[list[dict], list[Image.Image]]:
    """Swap each image reference for a template placeholder and load the picture, in order of appearance.

    User turns carry untrusted text: with `tokens`, their spellings are neutralised (prompt_text.py). With
    `empty_user_text` every user text is left out and no image is loaded: the prompt's structure alone."""
    out, images = [], []
    for m in messages:
        m = m.model_dump() if hasattr(m, "model_dump") else m
        parts = []
        for part in m["content"]:
            if part["type"] == "image":
                if blobs is not None:
                    images.append(load_image(blobs.get(part["ref"])))
                parts.append({"type": "image"})
            elif m["role"] == "user":
                parts.append({"type": "text", "text": "" if empty_user_text else neutralise(part["text"], tokens)})
            else:
                parts.append({"type": "text", "text": part["text"]})
        out.append({"role": m["role"], "content": parts})
    return out, images


def encode_prompt(processor, messages, blobs: BlobStore) -> EncodedPrompt:
    """The model inputs of one prompt. Raises PromptStructureError for a prompt whose text would change its
    structure (a token spelled in untrusted text that neutralising missed) or whose image placeholders do not
    match its images, before the processor can fail in a way that says neither."""
    tok = processor.tokenizer
    template_messages, images = to_template_messages(messages, blobs, tokens_for(tok))
    skeleton_messages, _ = to_template_messages(messages, None, empty_user_text=True)
    text = processor.apply_chat_template(template_messages, tokenize=False, add_generation_prompt=True)
    skeleton = processor.apply_chat_template(skeleton_messages, tokenize=False, add_generation_prompt=True)
    check_structure(tok, text, skeleton)
    try:
        enc = processor(text=[text], images=images or None, return_tensors="pt", return_mm_token_type_ids=True)
    except (StopIteration, ValueError, IndexError) as e:
        # StopIteration: transformers ran out of images for a placeholder; never let it leave as itself (asyncio
        # cannot put a StopIteration into a future, and the activity would never complete).
        raise PromptStructureError(f"the processor refused the prompt: {type(e).__name__}: {e}") from None
    ids = enc["input_ids"][0]
    grid = enc.get("image_grid_thw")
    image_token = getattr(processor, "image_token_id", None)
    if image_token is not None:
        merge = getattr(processor.image_processor, "merge_size", 2)
        want = int(grid.prod(-1).sum()) // merge**2 if grid is not None else 0
        got = int((ids == image_token).sum())
        if got != want:
            raise PromptStructureError(
                f"the prompt has {got} image placeholder tokens for {len(images)} image(s) that need {want}"
            )
    mm = enc.get("mm_token_type_ids")
    mm = mm[0] if mm is not None else torch.zeros_like(ids)
    return EncodedPrompt(
        input_ids=ids,
        mm_token_type_ids=mm.long(),
        pixel_values=enc.get("pixel_values"),
        image_grid_thw=grid,
        text=text,
    )


class PromptCache:
    """Encodes each distinct prompt of a batch once (a GRPO group repeats the same screenshot N times)."""

    def __init__(self, processor, blobs: BlobStore):
        self.processor, self.blobs, self._cache = processor, blobs, {}

    def get(self, messages) -> EncodedPrompt:
        key = prompt_key(messages)
        if key not in self._cache:
            self._cache[key] = encode_prompt(self.processor, messages, self.blobs)
        return self._cache[key]


@dataclass
class PromptIdsMismatch:
    """Where the server's prompt ids first part from the learner's (`position` may be the shorter one's length)."""

    position: int
    server_id: int | None  # None: the server's ids end here
    learner_id: int | None
    server_text: str  # the decoded neighbourhood of the position on each side
    learner_text: str
    lengths: tuple[int, int]  # (server, learner)
    differing: int  # positions whose ids differ, plus the length difference

    @property
    def fraction(self) -> float:
        """The share of the longer encoding that differs: one merged space is small, a different image size
        (every id after the image shifted) is most of the prompt."""
        return self.differing / max(self.lengths)

    def describe(self) -> str:
        return (
            f"first difference at position {self.position} of ({self.lengths[0]} server, {self.lengths[1]} learner) "
            f"ids ({self.differing} differ): server {self.server_id} vs learner {self.learner_id}; "
            f"server ...{self.server_text!r}... learner ...{self.learner_text!r}..."
        )


def compare_prompt_ids(tokenizer, server: list[int], learner: list[int], context: int = 8) -> PromptIdsMismatch | None:
    """None when the server encoded the prompt to exactly the learner's ids, else the first difference."""
    if server == learner:
        return None
    pos = next((i for i, (a, b) in enumerate(zip(server, learner)) if a != b), min(len(server), len(learner)))

    def around(ids: list[int]) -> str:
        return tokenizer.decode(ids[max(0, pos - context) : pos + context], skip_special_tokens=False)

    return PromptIdsMismatch(
        position=pos,
        server_id=server[pos] if pos < len(server) else None,
        learner_id=learner[pos] if pos < len(learner) else None,
        server_text=around(server),
        learner_text=around(learner),
        lengths=(len(server), len(learner)),
        differing=sum(a != b for a, b in zip(server, learner)) + abs(len(server) - len(learner)),
    )


# ---- completions ---------------------------------------------------------------------------------


@dataclass
class Retokenized:
    ids: list[int]
    mismatch: bool  # see completion_ids_from_text


def completion_ids_from_text(tokenizer, prompt_text: str, completion: str, end_of_turn: bool) -> Retokenized:
    """Token ids for a completion that arrived as text only.

    The sampler's own ids are unknown, so the text is tokenised on its own (what an assistant turn after
    the generation prompt looks like) and followed by the end-of-turn token when the sampler stopped by
    itself. `mismatch` flags texts whose tokenisation is not a faithful stand-in for what was sampled:
    the ids do not decode back to the text, or tokenising prompt+completion together splits the
    completion differently (a BPE merge across the boundary), i.e. there is more than one plausible id
    sequence for this text.
    """
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    mismatch = tokenizer.decode(ids, skip_special_tokens=False) != completion
    if not mismatch and completion:
        # Only the end of the prompt ("<|im_start|>assistant\n") can merge with the completion.
        prompt_text = prompt_text[max(prompt_text.rfind("<|im_start|>"), 0) :]
        prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
        joint = tokenizer(prompt_text + completion, add_special_tokens=False)["input_ids"]
        mismatch = joint[: len(prompt_ids)] != prompt_ids or joint[len(prompt_ids) :] != ids
    if end_of_turn:
        ids = ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return Retokenized(ids=ids, mismatch=mismatch)
