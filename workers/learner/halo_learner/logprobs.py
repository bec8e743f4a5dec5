"""Per-token log-probs of completions under a multimodal prompt, computed three ways that must agree:

* `padded_logprobs`: the textbook batch (left-padded prompts + right-padded completions, one forward each),
  the baseline and the reference for tests;
* `group_logprobs`: a group of completions of ONE prompt; the prompt (image included) runs once with
  `use_cache`, its KV cache is expanded to the group size and the completions run on top. The graph is
  kept whole, so any loss can be back-propagated through it;
* `group_backward`: the same sharing for a loss that is a sum over tokens (dr_grpo), in chunks of rows, with
  the gradient of the shared prompt pass accumulated once (see the function);
* `packed_group_logprobs`: a group of completions of ONE prompt packed into ONE sequence
  `prompt | c_1[:-1] | c_2[:-1] | ...` with a block attention mask (the prompt is causal; each completion sees
  the whole prompt and its own earlier tokens) and M-RoPE positions that restart after the prompt for every
  completion. One forward (and one backward) per group: no KV cache, no expansion, no second prompt pass.
  This is what the GRPO and DPO updates use; `checkpointed_layers` trades a recompute for activation memory.

Logits are divided by the sampling temperature before the log-softmax, as the sampler did. A completion
sampled under a grammar (constrained decoding) comes with its per-position bitmask (grammar.py); its logits
are masked to the allowed tokens first, as the sampler's were, so both describe the same distribution.
Positions are Qwen3-VL's 3-D M-RoPE ids, computed here explicitly so all three ways use identical ones.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from transformers import DynamicCache

from .grammar import masked, unpack_bitmask
from .prompts import EncodedPrompt

# Per completion: its (len, ceil(V/32)) int32 grammar bitmask, or None (unconstrained).
Bitmasks = list["torch.Tensor | None"]


def hf_model(policy):
    """The Qwen3VLForConditionalGeneration inside the PeftModel (LoRA layers are injected in place)."""
    return policy.model.base_model.model


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    # float32 log-softmax: bf16 logsumexp over 151k entries is too coarse for importance ratios.
    logp = F.log_softmax(masked(logits.float(), allowed) / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def pad_completions(completions: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask, (B, L) with L the longest completion."""
    L = max(len(c) for c in completions)
    ids = torch.full((len(completions), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(completions), L), dtype=torch.bool)
    for i, c in enumerate(completions):
        ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, : len(c)] = True
    return ids.to(device), mask.to(device)


def _vision_inputs(prompts: list[EncodedPrompt], device, dtype) -> dict:
    pix = [p.pixel_values for p in prompts if p.pixel_values is not None]
    if not pix:
        return {}
    # pixel_values are flat rows over all images of all prompts, in order; grids say where each image ends.
    return {
        "pixel_values": torch.cat(pix).to(device, dtype),
        "image_grid_thw": torch.cat([p.image_grid_thw for p in prompts if p.image_grid_thw is not None]).to(device),
    }


def rope_positions(policy, input_ids, mm_token_type_ids, image_grid_thw, attention_mask):
    """(3, B, S) M-RoPE position ids and (B, 1) deltas (max position + 1 - real length) of each row."""
    return hf_model(policy).model.get_rope_index(
        input_ids,
        mm_token_type_ids=mm_token_type_ids,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
    )


# ---- unshared: one padded batch ------------------------------------------------------------------


def allowed_table(bitmasks: Bitmasks | None, lengths: list[int], L: int, V: int, device) -> torch.Tensor | None:
    """(B, L, V) bool of allowed tokens (all True for unconstrained rows and padding); None when no row has a grammar."""
    if not bitmasks or all(b is None for b in bitmasks):
        return None
    out = torch.ones((len(lengths), L, V), dtype=torch.bool, device=device)
    for i, b in enumerate(bitmasks):
        if b is not None:
            out[i, : lengths[i]] = _allowed_rows(b[: lengths[i]], V, device)
    return out


def _allowed_rows(bitmask: torch.Tensor, V: int, device) -> torch.Tensor:
    rows = unpack_bitmask(bitmask.to(device), V)
    if rows.shape[-1] < V:  # lm_head padding beyond the grammar's vocabulary: never allowed
        rows = F.pad(rows, (0, V - rows.shape[-1]), value=False)
    return rows


def left_padded(policy, prompts: list[EncodedPrompt]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, P) token ids, attention mask and multimodal token types of the prompts, left-padded to the longest."""
    dev, pad = policy.device, policy.tokenizer.pad_token_id
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad, dtype=torch.long, device=dev)
    mask = torch.zeros((len(prompts), P), dtype=torch.long, device=dev)
    mm = torch.zeros((len(prompts), P), dtype=torch.long, device=dev)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = p.input_ids.to(dev)
        mask[i, P - len(p) :] = 1
        mm[i, P - len(p) :] = p.mm_token_type_ids.to(dev)
    return ids, mask, mm


def padded_logprobs(
    policy,
    prompts: list[EncodedPrompt],
    completions: list[list[int]],
    temperature: float,
    bitmasks: Bitmasks | None = None,
):
    """(B, L) completion log-probs and mask from one forward over left-padded prompt + right-padded completion."""
    dev = policy.device
    comp, cmask = pad_completions(completions, policy.tokenizer.pad_token_id, dev)
    B, L = comp.shape
    ids, pmask, mm = left_padded(policy, prompts)
    mm = torch.cat([mm, torch.zeros((B, L), dtype=torch.long, device=dev)], dim=1)  # completion tokens are text (0)
    input_ids = torch.cat([ids, comp], dim=1)
    attn = torch.cat([pmask, cmask.long()], dim=1)
    vision = _vision_inputs(prompts, dev, policy.dtype)
    pos, _ = rope_positions(policy, input_ids, mm, vision.get("image_grid_thw"), attn)
    out = hf_model(policy)(
        input_ids=input_ids,
        attention_mask=attn,
        position_ids=pos,
        mm_token_type_ids=mm,
        use_cache=False,
        logits_to_keep=L + 1,
        **vision,
    )
    logits = out.logits[:, :-1]  # position P-1+j predicts completion token j
    allowed = allowed_table(bitmasks, [len(c) for c in completions], L, logits.shape[-1], dev)
    return token_logprobs(logits, comp, temperature, allowed), cmask


# ---- shared prefix -------------------------------------------------------------------------------


@dataclass
class PromptPass:
    last_logits: torch.Tensor  # (B, V): predicts the first completion token
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, (B, heads, P, head_dim)
    length: int  # P (the longest prompt; shorter ones are left-padded)
    # M-RoPE delta: completion token j sits at position P + delta + j; (B,) when the prompts are several
    delta: int | torch.Tensor
    mask: torch.Tensor | None = None  # (B, P) 1 on prompt tokens, 0 on left padding; None: no padding

    def rows(self, index: torch.Tensor) -> "PromptPass":
        """The pass with its prompts repeated as `index` says (row r is prompt index[r]), KV included."""
        delta = self.delta[index] if isinstance(self.delta, torch.Tensor) else self.delta
        return PromptPass(
            self.last_logits[index],
            [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.kv],
            self.length,
            delta,
            None if self.mask is None else self.mask[index],
        )


def run_prompt(policy, prompt: EncodedPrompt) -> PromptPass:
    return run_prompts(policy, [prompt])


def run_prompts(policy, prompts: list[EncodedPrompt]) -> PromptPass:
    """The prompts' pass with its KV cache: one prompt, or several left-padded in one batch (colocated sampling of
    calls that arrive together)."""
    ids, attn, mm = left_padded(policy, prompts)
    vision = _vision_inputs(prompts, policy.device, policy.dtype)
    pos, delta = rope_positions(policy, ids, mm, vision.get("image_grid_thw"), attn)
    out = hf_model(policy)(
        input_ids=ids,
        attention_mask=attn,
        position_ids=pos,
        mm_token_type_ids=mm,
        use_cache=True,
        logits_to_keep=1,
        **vision,
    )
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    P = ids.shape[1]
    if len(prompts) == 1:
        return PromptPass(out.logits[:, -1], kv, P, int(delta.reshape(-1)[0]))
    # A row's next position is its own length + its delta; as P + delta it takes the padding off.
    lengths = attn.sum(-1)
    return PromptPass(out.logits[:, -1], kv, P, delta.reshape(-1) + lengths - P, attn)


def expanded_cache(policy, kv, rows: int) -> DynamicCache:
    # expand() is a view; the cache's first update concatenates it into a fresh tensor, so no in-place
    # write ever touches the shared prompt KV, and autograd sums the rows' gradients back into it.
    cache = DynamicCache(config=hf_model(policy).config)
    for i, (k, v) in enumerate(kv):
        cache.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1), i)
    return cache


def run_continuation(
    policy, prompt_pass: PromptPass, cache: DynamicCache, tokens: torch.Tensor, mask: torch.Tensor, start: int
) -> torch.Tensor:
    """Logits (n, T, V) for `tokens` (n, T) placed at completion offsets start..start+T-1 after the prompt.

    `mask` (n, start+T) covers the completion tokens already in the cache plus these.
    """
    n, T = tokens.shape
    P = prompt_pass.length
    offs = torch.arange(start, start + T, device=tokens.device)
    delta = prompt_pass.delta
    if isinstance(delta, torch.Tensor):
        pos = (P + delta.view(n, 1) + offs.view(1, T)).unsqueeze(0).expand(3, n, T)
    else:
        pos = (P + delta + offs).view(1, 1, T).expand(3, n, T)
    prompt_mask = prompt_pass.mask
    if prompt_mask is None:
        prompt_mask = torch.ones((n, P), dtype=torch.long, device=tokens.device)
    attn = torch.cat([prompt_mask.long(), mask.long()], dim=1)
    out = hf_model(policy)(
        input_ids=tokens,
        attention_mask=attn,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits


def group_logprobs(
    policy, prompt: EncodedPrompt, completions: list[list[int]], temperature: float, bitmasks: Bitmasks | None = None
):
    """(G, L) log-probs and mask of G completions of one prompt; the prompt runs once."""
    pp = run_prompt(policy, prompt)
    comp, cmask = pad_completions(completions, policy.tokenizer.pad_token_id, policy.device)
    G, L = comp.shape
    allowed = allowed_table(bitmasks, [len(c) for c in completions], L, pp.last_logits.shape[-1], policy.device)
    first_allowed = allowed[:, 0] if allowed is not None else None
    first = token_logprobs(pp.last_logits.expand(G, -1), comp[:, 0], temperature, first_allowed)[:, None]
    if L == 1:
        return first, cmask
    cache = expanded_cache(policy, pp.kv, G)
    logits = run_continuation(policy, pp, cache, comp[:, :-1], cmask[:, :-1], 0)
    rest = token_logprobs(logits, comp[:, 1:], temperature, allowed[:, 1:] if allowed is not None else None)
    return torch.cat([first, rest], dim=1), cmask


# A sum-over-tokens loss restricted to some rows and token columns: loss_fn(logps, rows, cols) -> scalar.
TokenLoss = Callable[[torch.Tensor, torch.Tensor, slice], torch.Tensor]


def group_backward(
    policy,
    prompt: EncodedPrompt,
    completions: list[list[int]],
    temperature: float,
    loss_fn: TokenLoss,
    chunk: int,
    on_chunk: Callable[[], None] | None = None,
) -> float:
    """Back-propagate sum_rows,tokens loss through one shared prompt pass; returns the loss value.

    The prompt pass keeps its graph; its KV tensors are handed to the completion chunks as detached
    leaves, each chunk back-propagates into the LoRA weights and into those leaves, and finally the summed
    leaf gradients (plus the first-token loss, which reads the prompt's last logits) go back through the
    prompt graph in a single backward. Exactly the gradient of the whole group, but only one chunk of
    completion activations is alive at a time and the prompt is never re-run.
    """
    pp = run_prompt(policy, prompt)
    comp, cmask = pad_completions(completions, policy.tokenizer.pad_token_id, policy.device)
    G, L = comp.shape
    all_rows = torch.arange(G, device=policy.device)
    first = token_logprobs(pp.last_logits.expand(G, -1), comp[:, 0], temperature)[:, None]
    loss_first = loss_fn(first, all_rows, slice(0, 1))
    total = float(loss_first.detach())
    leaves = [(k.detach().requires_grad_(True), v.detach().requires_grad_(True)) for k, v in pp.kv]
    if L > 1:
        for s in range(0, G, chunk):
            rows = all_rows[s : s + chunk]
            cache = expanded_cache(policy, leaves, len(rows))
            logits = run_continuation(policy, pp, cache, comp[rows, :-1], cmask[rows, :-1], 0)
            rest = token_logprobs(logits, comp[rows, 1:], temperature)
            loss = loss_fn(rest, rows, slice(1, L))
            loss.backward()
            total += float(loss.detach())
            del cache, logits, rest, loss
            if on_chunk:
                on_chunk()
    outputs, grads = [loss_first], [torch.ones_like(loss_first)]
    for (k, v), (lk, lv) in zip(pp.kv, leaves):
        for t, leaf in ((k, lk), (v, lv)):
            if leaf.grad is not None and t.requires_grad:
                outputs.append(t)
                grads.append(leaf.grad)
    torch.autograd.backward(outputs, grads)
    return total


# ---- shared prefix, packed into one sequence -----------------------------------------------------

PACK_ALIGN = 16
# Attention implementations that honour an arbitrary 4-D boolean mask. eager adds the mask to the scores
# (a boolean True becomes +1, not "allowed"; 0.98 nats off on the tiny model) and FlashAttention-2 ignores
# 4-D masks altogether, so the packed layout would silently let completions see each other.
BLOCK_MASK_ATTENTION = ("sdpa",)


class UnsupportedAttention(RuntimeError):
    """The model runs an attention implementation under which the packed block mask is wrong."""


def check_block_mask_attention(policy) -> None:
    impl = getattr(hf_model(policy).model.language_model.config, "_attn_implementation", None)
    if impl not in BLOCK_MASK_ATTENTION:
        raise UnsupportedAttention(
            f"the packed GRPO pass needs attention that honours a 4-D block mask ({', '.join(BLOCK_MASK_ATTENTION)}), "
            f"but the model runs {impl!r}; load it with attn_implementation='sdpa' or set HALO_PREFIX_SHARING=0 "
            "(padded batches, slower)"
        )


@dataclass
class PackedLayout:
    """Where each completion token of a packed group sits; built once per (prompt length, completions)."""

    input_ids: torch.Tensor  # (1, S): prompt, then c_i[:-1] for each completion i
    position_ids: torch.Tensor  # (3, 1, S) M-RoPE positions
    attention_mask: torch.Tensor  # (1, 1, S, S) bool, True = may attend
    targets: torch.Tensor  # (S - P,) token predicted by kept logits row 1.. (row 0 predicts first tokens)
    first: torch.Tensor  # (G,) first token of every completion (predicted by the prompt's last position)
    flat_index: torch.Tensor  # (S - P,) index into the (G, L) result, row-major, for kept rows 1..
    mask: torch.Tensor  # (G, L) bool completion mask
    first_kept: int  # P - 1: the prompt's last position
    keep: int  # logits kept from there on: the prompt's last position and every completion position
    visual_mask: torch.Tensor | None  # (1, S) bool: the prompt's image-token positions
    image_embeds: torch.Tensor | None  # (image tokens, hidden) from the frozen ViT, no grad
    deepstack_embeds: list[torch.Tensor] | None  # per deepstack layer, (image tokens, hidden)


@dataclass
class ImageFeatures:
    """The frozen ViT's output for one prompt's images: a constant of the step, shared by every pass over it."""

    embeds: torch.Tensor  # (image tokens, hidden)
    deepstack: list[torch.Tensor] | None  # per deepstack layer, (image tokens, hidden)


def image_features(policy, prompt: EncodedPrompt) -> ImageFeatures | None:
    """The ViT's output for the prompt's images (None without images); no gradient (the ViT has no LoRA and
    pixel_values are leaves)."""
    vision = _vision_inputs([prompt], policy.device, policy.dtype)
    if not vision:
        return None
    with torch.no_grad():
        feats = hf_model(policy).model.get_image_features(
            vision["pixel_values"], vision["image_grid_thw"], return_dict=True
        )
    deepstack = list(feats.deepstack_features) if feats.deepstack_features is not None else None
    return ImageFeatures(torch.cat(list(feats.pooler_output), dim=0), deepstack)


def packed_layout(
    policy, prompt: EncodedPrompt, completions: list[list[int]], features: ImageFeatures | None = None
) -> PackedLayout:
    """`features`: the prompt's `image_features`, when the caller builds several layouts over one prompt."""
    check_block_mask_attention(policy)
    dev = policy.device
    P = len(prompt)
    G, L = len(completions), max(len(c) for c in completions)
    ids = prompt.input_ids.to(dev)[None]
    mm = prompt.mm_token_type_ids.to(dev)[None]
    has_image = prompt.pixel_values is not None and prompt.image_grid_thw is not None
    grid = prompt.image_grid_thw.to(dev) if has_image else None
    pos, delta = rope_positions(policy, ids, mm, grid, torch.ones_like(ids))
    base = P + int(delta.reshape(-1)[0])  # completion token j of every completion sits at base + j

    body, seg, offs, flat = [], [], [], []
    for i, c in enumerate(completions):
        n = len(c) - 1  # inputs c[:-1]; their logits predict c[1:]
        body += c[:-1]
        seg += [i + 1] * n
        offs += range(n)
        flat += [i * L + j + 1 for j in range(n)]
    C = len(body)
    # Pad the packed length to a multiple of 16 (sdpa's memory-efficient kernel wants an aligned mask, and
    # a compiled graph sees fewer distinct lengths); each pad token attends to the prompt and itself only
    # and its logits are never computed.
    pad = (-(P + C)) % PACK_ALIGN
    body += [policy.tokenizer.pad_token_id or 0] * pad
    seg += [G + 1 + k for k in range(pad)]
    offs += [0] * pad
    comp_ids = torch.tensor(body, dtype=torch.long, device=dev).view(1, C + pad)
    comp_pos = (base + torch.tensor(offs, dtype=torch.long, device=dev)).view(1, 1, -1).expand(3, 1, C + pad)
    segment = torch.cat([torch.zeros(P, dtype=torch.long, device=dev), torch.tensor(seg, dtype=torch.long, device=dev)])
    S = P + C + pad
    idx = torch.arange(S, device=dev)
    causal = idx[None, :] <= idx[:, None]
    same = (segment[None, :] == 0) | (segment[None, :] == segment[:, None])
    targets = torch.tensor([t for c in completions for t in c[1:]], dtype=torch.long, device=dev)
    _, mask = pad_completions(completions, 0, dev)
    visual_mask = image_embeds = deepstack = None
    if has_image:
        # Computed once per layout (or given) and reused by the reference and the gradient pass over it.
        feats = features if features is not None else image_features(policy, prompt)
        image_embeds, deepstack = feats.embeds, feats.deepstack
        visual_mask = torch.cat([mm[0] == 1, torch.zeros(C + pad, dtype=torch.bool, device=dev)])[None]
    return PackedLayout(
        input_ids=torch.cat([ids, comp_ids], dim=1),
        position_ids=torch.cat([pos, comp_pos.to(pos.dtype)], dim=2),
        attention_mask=(causal & same).view(1, 1, S, S),
        targets=targets,
        first=torch.tensor([c[0] for c in completions], dtype=torch.long, device=dev),
        flat_index=torch.tensor(flat, dtype=torch.long, device=dev),
        mask=mask,
        first_kept=P - 1,
        keep=C + 1,
        visual_mask=visual_mask,
        image_embeds=image_embeds,
        deepstack_embeds=deepstack,
    )


def packed_group_logprobs(
    policy,
    prompt: EncodedPrompt,
    completions: list[list[int]],
    temperature: float,
    layout: PackedLayout | None = None,
    bitmasks: Bitmasks | None = None,
):
    """(G, L) log-probs (0 where masked) and mask of G completions of one prompt, from one packed forward.

    Differentiable: the graph is kept whole, so any loss over the result can be back-propagated through it.
    """
    check_block_mask_attention(policy)  # a layout built earlier does not prove the model still runs sdpa
    lay = layout or packed_layout(policy, prompt, completions)
    # Qwen3VLModel.forward, image-only, with the placeholders taken from the layout rather than from
    # `input_ids == image_token_id`: a sampled completion may contain that token id, and it is plain text
    # there (as in the sampler's cached continuation).
    m = hf_model(policy)
    embeds = m.model.get_input_embeddings()(lay.input_ids)
    if lay.image_embeds is not None:
        embeds = embeds.masked_scatter(lay.visual_mask[..., None], lay.image_embeds.to(embeds.dtype))
    with compiled_stance(policy):
        hidden = m.model.language_model(
            inputs_embeds=embeds,
            attention_mask=lay.attention_mask,
            position_ids=lay.position_ids,
            use_cache=False,
            visual_pos_masks=lay.visual_mask,
            deepstack_visual_embeds=lay.deepstack_embeds,
        ).last_hidden_state
    logits = m.lm_head(hidden[:, lay.first_kept : lay.first_kept + lay.keep])
    del hidden, embeds
    G, L = lay.mask.shape
    if bitmasks and any(b is not None for b in bitmasks):
        first, rest = _masked_packed(logits[0].float(), lay, completions, temperature, bitmasks)
    else:
        logp = F.log_softmax(logits[0].float() / temperature, dim=-1)  # (keep, V); row 0 = prompt's last
        first = logp[0].index_select(0, lay.first)  # (G,)
        rest = logp[1:].gather(-1, lay.targets[:, None]).squeeze(-1)
    del logits
    flat = torch.zeros(G * L, dtype=first.dtype, device=first.device)
    flat = flat.index_put((torch.arange(G, device=first.device) * L,), first)
    if rest.numel():
        flat = flat.index_put((lay.flat_index,), rest)
    return flat.view(G, L), lay.mask


def _masked_packed(
    logits: torch.Tensor, lay: PackedLayout, completions: list[list[int]], temperature: float, bitmasks: Bitmasks
) -> tuple[torch.Tensor, torch.Tensor]:
    """First-token and later-token log-probs of a packed group, each position under its own grammar mask.

    Row 0 (the prompt's last position) predicts every completion's first token, each under its own mask;
    rows 1.. follow `completions` in order, c_i[1:] for each i.
    """
    V, dev = logits.shape[-1], logits.device
    first = []
    for i, c in enumerate(completions):
        b = bitmasks[i]
        allowed = _allowed_rows(b[:1], V, dev)[0] if b is not None else None
        first.append(F.log_softmax(masked(logits[0], allowed) / temperature, dim=-1)[c[0]])
    rows = [
        (
            _allowed_rows(b[1 : len(c)], V, dev)
            if b is not None
            else torch.ones((len(c) - 1, V), dtype=torch.bool, device=dev)
        )
        for b, c in zip(bitmasks, completions)
    ]
    rest_logits = logits[1:]
    if rows and sum(r.shape[0] for r in rows):
        rest_logits = masked(rest_logits, torch.cat(rows))
    rest = F.log_softmax(rest_logits / temperature, dim=-1).gather(-1, lay.targets[:, None]).squeeze(-1)
    return torch.stack(first), rest


@contextlib.contextmanager
def checkpointed_layers(policy, layers: int | bool = True):
    """Gradient checkpointing of the language model's first `layers` decoder layers (True: all of them) for the
    passes run inside: each keeps only its input and is recomputed (non-reentrant torch.utils.checkpoint) when the
    backward reaches it. The first ones, because the backward reaches them last, when the activations of the layers
    after them are already freed: their recompute adds nothing to the peak (memory.py). The layers' own `training`
    flag turns transformers' checkpointing on; their submodules stay in eval mode (no dropout anywhere: LoRA dropout
    is 0, attention dropout applies in training mode only and is 0 too)."""
    stack = hf_model(policy).model.language_model.layers
    n = len(stack) if layers is True else int(layers)
    if n <= 0:
        yield
        return
    chosen = list(stack)[:n]
    saved = [(layer.gradient_checkpointing, layer.training) for layer in chosen]
    ckpt = functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=False)
    try:
        for layer in chosen:
            layer.gradient_checkpointing, layer.training, layer._gradient_checkpointing_func = True, True, ckpt
        yield
    finally:
        for layer, (gc, training) in zip(chosen, saved):
            layer.gradient_checkpointing, layer.training = gc, training


# ---- optional: compiled decoder layers for the packed path ---------------------------------------

_COMPILED = "_halo_compiled_layers"


def compile_packed_layers(policy) -> None:
    """torch.compile each language-model decoder layer (regional compilation: one layer's graph, reused by
    all 36) for the packed GRPO and DPO passes only. Everything else (padded baselines, sampler) keeps running
    eager: the process-wide compiler stance becomes "force_eager" and `packed_group_logprobs` switches it
    back around its decoder stack. Three graphs get compiled on first use (no-grad reference, gradient
    pass first layer, other layers), with dynamic sequence length, so later groups do not recompile.
    """
    if getattr(policy, _COMPILED, False):
        return
    for layer in hf_model(policy).model.language_model.layers:
        layer.compile(dynamic=True)
    torch.compiler.set_stance("force_eager")
    setattr(policy, _COMPILED, True)


def compiled_stance(policy):
    """Around a packed pass (and its backward, where checkpointed layers are recomputed): compiled layers run."""
    if getattr(policy, _COMPILED, False):
        return torch.compiler.set_stance("default")
    return contextlib.nullcontext()
