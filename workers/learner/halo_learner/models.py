"""Loading the policy: Qwen3-VL (any HF id or local path) or a seeded tiny random Qwen3-VL, wrapped in LoRA.

The tiny model goes through exactly the same classes and loading code as the 8B one: it is built once,
saved with `save_pretrained`, and every start loads it back with `from_pretrained`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from . import paths

DEFAULT_MODEL = "Qwen/Qwen3-VL-8B-Instruct"
TINY = "tiny-random"
# Bump when the tiny recipe changes so stale caches are not reused.
TINY_RECIPE = "v2"
TINY_SEED = 1234

# Ranks vLLM's --max-lora-rank accepts (1 too, but a rank-1 adapter is no use here).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)

# Names that exist only in the language model; the vision tower uses qkv/proj/linear_fc1/linear_fc2, so
# an explicit list keeps LoRA off the ViT ("all-linear" would wrap it, and vLLM would ignore those weights).
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Renders our message format the way Qwen3-VL's own template does for the parts we use
# (text and images, no tools, no thinking), so the tiny model sees the same token layout as the 8B.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass
class LoraSettings:
    rank: int = 16
    alpha: int = 32
    seed: int = 0

    @classmethod
    def from_env(cls) -> "LoraSettings":
        s = cls(
            rank=int(os.environ.get("HALO_LORA_RANK", 16)),
            alpha=int(os.environ.get("HALO_LORA_ALPHA", 32)),
            seed=int(os.environ.get("HALO_LORA_SEED", 0)),
        )
        if s.rank not in VLLM_LORA_RANKS:
            raise ValueError(f"HALO_LORA_RANK={s.rank} is not a rank vLLM accepts {VLLM_LORA_RANKS}")
        return s


@dataclass
class Policy:
    """The resident model: a PeftModel with one LoRA adapter named 'default', plus its processor."""

    model: torch.nn.Module
    processor: object
    model_id: str
    device: torch.device
    dtype: torch.dtype
    lora: LoraSettings
    # Adapter weights right after the seeded LoRA init: "version 0" of every run.
    initial_adapter: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}


def pick_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


# ---- tiny random model ---------------------------------------------------------------------------


def _tiny_corpus() -> list[str]:
    # Enough browser-agent flavoured text for a few hundred byte-level merges; fixed so the build is reproducible.
    words = (
        "You are a web agent. You see a screenshot of a browser page, its accessibility tree and a goal. "
        "Choose exactly one next action and answer with exactly one tool call. click the button submit "
        "type the text into the field scroll down wait answer left_click coordinate element_id "
        '<tool_call> {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}} '
        "</tool_call> Goal: URL: Step: Accessibility tree: Previous actions: none What is the next action? "
        "0 1 2 3 4 5 6 7 8 9 10 100 250 999 1000 link textbox checkbox heading OK Cancel yes no "
    )
    return [words] * 4 + [w for w in words.split()]


def build_tiny_processor(
    image_min_pixels: int = 32 * 32 * 4, image_max_pixels: int = 32 * 32 * 64, vocab_size: int = 400
):
    """A byte-level BPE tokenizer trained in memory plus Qwen3-VL's image/video processors."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    # The PIL backend needs no torchvision (the CPU torch wheel has no matching torchvision here);
    # smart_resize, and so the token count, is the same as the torchvision backend's.
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": image_min_pixels, "longest_edge": image_max_pixels},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    return assemble_processor(fast, image_processor, CHAT_TEMPLATE)


def _video_processor(path: str | None):
    # Qwen3VLProcessor insists on a video processor, and transformers' video processors need torchvision,
    # which has no wheel matching the CPU torch build used here. Screenshots never use it, so without
    # torchvision a stand-in that refuses videos takes its place.
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        from transformers import AutoVideoProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        if path is not None:
            try:
                return AutoVideoProcessor.from_pretrained(path)
            except (OSError, ValueError):
                pass
        return Qwen3VLVideoProcessor(
            size={"shortest_edge": 4096, "longest_edge": 65536}, patch_size=16, temporal_patch_size=2, merge_size=2
        )
    import transformers

    class NoVideoProcessor(transformers.BaseVideoProcessor):
        def __init__(self):
            pass

        def __call__(self, *args, **kwargs):
            raise ValueError("videos are not supported by the HALO learner (install torchvision for video input)")

        def to_dict(self):
            return {}

    return NoVideoProcessor()


def assemble_processor(tokenizer, image_processor, chat_template: str, path: str | None = None):
    from transformers import Qwen3VLProcessor

    return Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=_video_processor(path),
        chat_template=chat_template,
    )


def load_processor(path: str):
    """Tokenizer + image processor + chat template of a checkpoint, assembled into a Qwen3VLProcessor."""
    from transformers import AutoTokenizer
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        from transformers import Qwen2VLImageProcessor as ImageProcessor
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as ImageProcessor,
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = ImageProcessor.from_pretrained(path)
    return assemble_processor(tokenizer, image_processor, _read_chat_template(path, tokenizer), path)


def _read_chat_template(path: str, tokenizer) -> str:
    from huggingface_hub import hf_hub_download

    for name in ("chat_template.jinja", "chat_template.json"):
        local = Path(path) / name
        try:
            f = local if local.exists() else (None if Path(path).exists() else Path(hf_hub_download(path, name)))
        except Exception:  # noqa: BLE001 - a template missing or unreachable on the Hub falls back to the tokenizer's
            f = None
        if f is not None and f.exists():
            text = f.read_text()
            return json.loads(text)["chat_template"] if name.endswith(".json") else text
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.chat_template
    raise FileNotFoundError(f"no chat template found for {path}")


def special_ids(tokenizer) -> dict[str, int]:
    return {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}


def tiny_config(tokenizer) -> Qwen3VLConfig:
    ids = special_ids(tokenizer)
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=4096,
            # sum(mrope_section) == head_dim/2 keeps the tiny model servable by vLLM too.
            rope_parameters={
                "rope_type": "default",
                "mrope_section": [4, 2, 2],
                "mrope_interleaved": True,
                "rope_theta": 5e6,
            },
            tie_word_embeddings=False,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            # 5x the usual init: with hidden size 64 the default 0.02 leaves logits so flat that no LoRA
            # update can move the sampling distribution much, and learning tests would measure nothing.
            initializer_range=0.1,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=16,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=64,
            num_position_embeddings=16,
            deepstack_visual_indexes=[1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def ensure_tiny_random(cache_dir: Path | None = None, seed: int = TINY_SEED) -> Path:
    """Build (once) and return the folder of the seeded tiny Qwen3-VL; concurrent builders are harmless."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    root = Path(cache_dir) if cache_dir is not None else paths.models_cache()
    target = root / (f"{TINY}-{TINY_RECIPE}" if seed == TINY_SEED else f"{TINY}-{TINY_RECIPE}-s{seed}")
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        processor = build_tiny_processor()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen3VLForConditionalGeneration(tiny_config(processor.tokenizer))
        model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
        model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
        model.save_pretrained(tmp)
        processor.tokenizer.save_pretrained(tmp)
        processor.image_processor.save_pretrained(tmp)
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        (tmp / "halo_tiny.json").write_text(json.dumps({"recipe": TINY_RECIPE, "seed": seed}))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
            # Another process won the race; its copy is identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---- loading -------------------------------------------------------------------------------------


def tiny_seed(name: str | None) -> int | None:
    """The init seed of a tiny random model name: `tiny-random` (1234), `tiny-random-s<seed>`; None for any other model.

    Other seeds give other random preferences between actions: a learning claim made with the tiny model has
    to hold for several of them, not for one draw of weights."""
    if name == TINY:
        return TINY_SEED
    m = re.fullmatch(rf"{TINY}-s(\d{{1,9}})", name or "")
    return int(m.group(1)) if m else None


def resolve_model_path(name: str) -> str:
    seed = tiny_seed(name)
    if seed is None:
        return name
    return str(ensure_tiny_random(seed=seed))


def load_policy(
    name: str | None = None,
    lora: LoraSettings | None = None,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Policy:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # worker logs, not terminal progress bars
    name = name or os.environ.get("HALO_MODEL") or DEFAULT_MODEL
    lora = lora or LoraSettings.from_env()
    auto_device, auto_dtype = pick_device()
    device, dtype = device or auto_device, dtype or auto_dtype
    path = resolve_model_path(name)
    processor = load_processor(path)
    # Straight onto the GPU: staging 16 GiB of 8B weights in host memory first is slow and needs the RAM.
    base = Qwen3VLForConditionalGeneration.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", device_map=str(device) if device.type == "cuda" else None
    )
    base.to(device)
    return wrap_lora(base, processor, model_id=name, lora=lora, device=device, dtype=dtype)


def wrap_lora(
    base: torch.nn.Module, processor, model_id: str, lora: LoraSettings, device: torch.device, dtype: torch.dtype
) -> Policy:
    for p in base.parameters():
        p.requires_grad_(False)
    cfg = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=0.0,  # dropout would make two passes disagree
        target_modules=list(LORA_TARGETS),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(lora.seed)
        model = get_peft_model(base, cfg)
    # No dropout anywhere, and eval mode keeps HF from switching use_cache off, which prefix sharing needs.
    model.eval()
    model.config.use_cache = False
    bad = [n for n, p in model.named_parameters() if p.requires_grad and ("visual" in n or "language_model" not in n)]
    if bad:
        raise RuntimeError(f"LoRA wrapped modules outside the language model: {bad[:5]}")
    policy = Policy(model=model, processor=processor, model_id=model_id, device=device, dtype=dtype, lora=lora)
    policy.initial_adapter = {n: p.detach().clone() for n, p in policy.trainable_parameters().items()}
    return policy
