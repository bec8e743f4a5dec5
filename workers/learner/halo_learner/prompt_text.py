"""Untrusted text on its way into a prompt: the learner's half of lib/model-io/prompt-text.ts.

A tokenizer matches its added tokens anywhere in a string, so a goal, a page or a typed text that spells
`<|im_end|>` or `<|image_pad|>` would become prompt structure (an image placeholder with no image made the
processor raise StopIteration). The TypeScript prompt builder breaks every such spelling in the user turn with a
zero-width space; the learner applies the same rule to the user turns it encodes (a no-op on prompts the builder
wrote, and the guard for anything that reaches it otherwise), then checks that the encoded prompt holds exactly
the template's own added tokens.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

# The added tokens of Qwen3-VL's tokenizer, the same list as lib/model-io/prompt-text.ts (a test compares them). The
# learner neutralises these together with whatever its own tokenizer adds.
QWEN3_VL_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

BREAK = "\u200b"


class PromptStructureError(ValueError):
    """A prompt whose encoding does not have the template's structure: the same prompt fails the same way on
    every attempt (non-retryable)."""


def added_tokens_of(tokenizer) -> tuple[str, ...]:
    """The tokenizer's own added tokens (special or not: it splits on both), sorted."""
    return tuple(sorted(tokenizer.get_added_vocab()))


def unlisted_added_tokens(tokenizer) -> list[str]:
    """Added tokens of this tokenizer that lib/model-io/prompt-text.ts does not know: prompts sent to vLLM leave them intact."""
    return [t for t in added_tokens_of(tokenizer) if t not in QWEN3_VL_ADDED_TOKENS]


@lru_cache(maxsize=8)
def _pattern(tokens: tuple[str, ...]) -> re.Pattern:
    # Longest first, so a token that is a prefix of another never wins the alternation.
    return re.compile("|".join(re.escape(t) for t in sorted(set(tokens), key=len, reverse=True) if t))


def neutralise(text: str, tokens: tuple[str, ...] = QWEN3_VL_ADDED_TOKENS) -> str:
    """`text` with every spelling of `tokens` broken after its first character; idempotent, repeated until nothing
    matches (as the TypeScript rule)."""
    if not tokens:
        return text
    pattern = _pattern(tokens)
    while True:
        out = pattern.sub(lambda m: m.group(0)[0] + BREAK + m.group(0)[1:], text)
        if out == text:
            return out
        text = out


def tokens_for(tokenizer) -> tuple[str, ...]:
    return tuple(sorted(set(QWEN3_VL_ADDED_TOKENS) | set(added_tokens_of(tokenizer))))


def check_structure(tokenizer, text: str, skeleton: str) -> None:
    """Raises PromptStructureError unless `text` (the rendered prompt) has exactly the added tokens of `skeleton`
    (the same messages rendered with every user text empty): no text may add, remove or reorder structure."""
    added = set(tokenizer.get_added_vocab().values())

    def structure(s: str) -> list[int]:
        return [i for i in tokenizer(s, add_special_tokens=False)["input_ids"] if i in added]

    got, want = structure(text), structure(skeleton)
    if got != want:
        extra = Counter(got) - Counter(want)
        names = [tokenizer.convert_ids_to_tokens(i) for i in (extra or Counter(want) - Counter(got))]
        raise PromptStructureError(
            f"the prompt's text {'adds' if extra else 'removes'} tokenizer tokens {sorted(set(names))} to its "
            "structure; untrusted text must be neutralised (lib/model-io/prompt.ts userTurn)"
        )
