"""Colocated sampling: n completions of one prompt with their per-token log-probs.

The prompt (screenshot included) is prefilled once and its KV cache shared by the n rows, like vLLM's
prefix caching. Sampling is plain temperature sampling (no top-k/top-p), and the log-probs are those of the
temperature-scaled distribution the tokens were drawn from, i.e. what the trainer recomputes.
temperature 0 means greedy; its log-probs are then those of the unscaled distribution.

With a grammar (constrained decoding, grammar.py) each row's logits are masked to the tokens its grammar
allows before the temperature and the sampling, and the log-probs reported are those of the masked
distribution, as vLLM reports them under structured outputs. A row ends when its grammar accepted a stop token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .grammar import Grammars, unpack_bitmask
from .logprobs import expanded_cache, run_continuation, run_prompt
from .prompts import EncodedPrompt


@dataclass
class Sampled:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None and i >= 0}


@torch.no_grad()
def sample(
    policy,
    prompt: EncodedPrompt,
    n: int,
    temperature: float,
    max_tokens: int,
    seed: int | None = None,
    grammars: Grammars | None = None,
    grammar_ref: str | None = None,
) -> list[Sampled]:
    dev = policy.device
    gen = None
    if seed is not None:
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
    stops = torch.tensor(sorted(stop_ids(policy.tokenizer)), device=dev)
    pad = policy.tokenizer.pad_token_id
    greedy = temperature == 0
    scale = 1.0 if greedy else temperature

    pp = run_prompt(policy, prompt)
    cache = expanded_cache(policy, pp.kv, n)
    logits = pp.last_logits.expand(n, -1)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    stopped = torch.zeros(n, dtype=torch.bool, device=dev)
    toks, lps, mask = [], [], torch.zeros((n, 0), dtype=torch.bool, device=dev)
    matchers = grammars.matchers(grammar_ref, n) if grammars is not None and grammar_ref else None
    bitmask = grammars.allocate(n) if matchers else None
    for t in range(max_tokens):
        scores = logits.float()
        if matchers:
            for i in range(n):
                if not done[i]:
                    grammars.fill(matchers[i], bitmask, i)
            allowed = unpack_bitmask(bitmask, grammars.vocab_size).to(dev)
            V = scores.shape[-1]
            if V > allowed.shape[-1]:  # lm_head padding beyond the tokenizer: never allowed
                allowed = F.pad(allowed, (0, V - allowed.shape[-1]), value=False)
            allowed[done] = True  # finished rows sample padding, which is never used
            scores = scores.masked_fill(~allowed, float("-inf"))
        logp = F.log_softmax(scores / scale, dim=-1)
        nxt = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        toks.append(nxt)
        lps.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
        mask = torch.cat([mask, (~done)[:, None]], dim=1)
        hit = torch.isin(nxt, stops) & ~done
        if matchers:
            for i in range(n):
                if not done[i]:
                    tok = int(nxt[i])
                    if not matchers[i].accept_token(tok):
                        raise RuntimeError(
                            f"grammar {grammar_ref} refused sampled token {tok}: mask and matcher disagree"
                        )
                    if matchers[i].is_terminated():
                        hit[i] = True
        stopped |= hit
        done |= hit
        if bool(done.all()) or t == max_tokens - 1:
            break
        logits = run_continuation(policy, pp, cache, nxt[:, None], mask, t)[:, -1]
    ids = torch.stack(toks, 1).tolist()
    lp = torch.stack(lps, 1).tolist()
    m = mask.tolist()
    out = []
    for i in range(n):
        k = sum(m[i])
        row_ids, row_lp = ids[i][:k], lp[i][:k]
        body = row_ids[:-1] if stopped[i] else row_ids  # the text leaves out the stop token, the ids keep it
        text = policy.tokenizer.decode(body, skip_special_tokens=False)
        out.append(
            Sampled(text=text, token_ids=row_ids, logprobs=row_lp, finish_reason="stop" if stopped[i] else "length")
        )
    return out
