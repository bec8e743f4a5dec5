"""Colocated sampling: n completions of a prompt with their per-token log-probs, for one call or several at once.

A prompt (screenshot included) is prefilled once and its KV cache shared by its n rows, like vLLM's prefix
caching. Calls that reach the learner together (sample_batcher.py) run as one batch: their prompts are
prefilled in one left-padded pass and all their rows decode together, each call's rows drawing from that
call's own seeded generator, so a seed draws the same completions alone or in a batch. Sampling is plain
temperature sampling (no top-k/top-p), and the log-probs are those of the temperature-scaled distribution the
tokens were drawn from, i.e. what the trainer recomputes. temperature 0 means greedy; its log-probs are then
those of the unscaled distribution.

With a grammar (constrained decoding, grammar.py) each row's logits are masked to the tokens its grammar
allows before the temperature and the sampling, and the log-probs reported are those of the masked
distribution, as vLLM reports them under structured outputs. A row ends when its grammar accepted a stop token.

`explore` ε > 0 draws each token from (1 − ε)·π + ε·uniform(allowed tokens) instead of π, and reports the
log-probs of that mixture: the behaviour policy the learner weights these samples against (grpo.py's decoupled
objective). Every action the grammar allows then has a floor of probability whatever the model prefers, so a
group whose on-policy candidates all scored alike can still find the rewarded action.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .grammar import Grammars, unpack_bitmask
from .logprobs import expanded_cache, run_continuation, run_prompts
from .prompts import EncodedPrompt


@dataclass
class Sampled:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class SampleRequest:
    """One call's share of a batch: n completions of `prompt`."""

    prompt: EncodedPrompt
    n: int
    temperature: float
    max_tokens: int
    seed: int | None = None
    grammar_ref: str | None = None
    explore: float = 0.0


def stop_ids(tokenizer) -> set[int]:
    ids = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None and i >= 0}


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
    return sample_batch(policy, [SampleRequest(prompt, n, temperature, max_tokens, seed, grammar_ref)], grammars)[0]


class _Rows:
    """Where each call's rows sit in the batch, and what each row samples with."""

    def __init__(self, requests: list[SampleRequest], dev) -> None:
        self.spans: list[slice] = []
        start = 0
        for r in requests:
            self.spans.append(slice(start, start + r.n))
            start += r.n
        self.count = start
        self.prompt_of = torch.tensor([k for k, r in enumerate(requests) for _ in range(r.n)], device=dev)
        # temperature 0 is greedy, with the log-probs of the unscaled distribution
        scale = [1.0 if r.temperature == 0 else r.temperature for r in requests for _ in range(r.n)]
        self.scale = torch.tensor(scale, device=dev, dtype=torch.float32)[:, None]
        self.last_step = torch.tensor([r.max_tokens - 1 for r in requests for _ in range(r.n)], device=dev)
        eps = [0.0 if r.temperature == 0 else r.explore for r in requests for _ in range(r.n)]
        self.explore = torch.tensor(eps, device=dev, dtype=torch.float32)[:, None] if any(eps) else None


def _mixed(logp: torch.Tensor, allowed: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """log((1 − ε)·p + ε·uniform over the allowed tokens), row by row (ε = 0 leaves a row as it is)."""
    uniform = allowed.float() / allowed.sum(-1, keepdim=True).clamp(min=1)
    return torch.log((1 - eps) * logp.exp() + eps * uniform)


@torch.no_grad()
def sample_batch(policy, requests: list[SampleRequest], grammars: Grammars | None = None) -> list[list[Sampled]]:
    """Each request's completions, in order; the requests share one prefill and one decoding loop."""
    dev = policy.device
    rows = _Rows(requests, dev)
    n = rows.count
    gens: list[torch.Generator | None] = []
    for r in requests:
        gen = None
        if r.seed is not None:
            gen = torch.Generator(device=dev)
            gen.manual_seed(r.seed)
        gens.append(gen)
    stops = torch.tensor(sorted(stop_ids(policy.tokenizer)), device=dev)
    pad = policy.tokenizer.pad_token_id

    pp = run_prompts(policy, [r.prompt for r in requests])
    if len(requests) > 1:
        pp = pp.rows(rows.prompt_of)
    cache = expanded_cache(policy, pp.kv, n)
    logits = pp.last_logits.expand(n, -1)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    stopped = torch.zeros(n, dtype=torch.bool, device=dev)
    toks, lps, mask = [], [], torch.zeros((n, 0), dtype=torch.bool, device=dev)
    matchers: list = [None] * n
    refs: list[str | None] = [None] * n
    if grammars is not None:
        for r, span in zip(requests, rows.spans):
            if r.grammar_ref:
                matchers[span] = grammars.matchers(r.grammar_ref, r.n)
                refs[span] = [r.grammar_ref] * r.n
    constrained = any(m is not None for m in matchers)
    bitmask = grammars.allocate(n) if constrained else None
    free = torch.tensor([m is None for m in matchers], device=dev)
    for t in range(max(r.max_tokens for r in requests)):
        scores = logits.float()
        if constrained:
            for i in range(n):
                if matchers[i] is not None and not done[i]:
                    grammars.fill(matchers[i], bitmask, i)
            allowed = unpack_bitmask(bitmask, grammars.vocab_size).to(dev)
            V = scores.shape[-1]
            if V > allowed.shape[-1]:  # lm_head padding beyond the tokenizer: never allowed
                allowed = F.pad(allowed, (0, V - allowed.shape[-1]), value=False)
            allowed[done | free] = True  # finished rows sample padding, which is never used
            scores = scores.masked_fill(~allowed, float("-inf"))
        logp = F.log_softmax(scores / rows.scale, dim=-1)
        if rows.explore is not None:
            logp = _mixed(logp, torch.isfinite(scores), rows.explore)
        nxt = torch.full((n,), pad, dtype=torch.long, device=dev)
        for r, span, gen in zip(requests, rows.spans, gens):
            # A call whose rows have all ended draws no more: its generator advances as it would alone.
            if bool(done[span].all()):
                continue
            if r.temperature == 0:
                nxt[span] = logp[span].argmax(-1)
            else:
                nxt[span] = torch.multinomial(logp[span].exp(), 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        toks.append(nxt)
        lps.append(logp.gather(-1, nxt[:, None]).squeeze(-1))
        mask = torch.cat([mask, (~done)[:, None]], dim=1)
        hit = torch.isin(nxt, stops) & ~done
        for i in range(n):
            if matchers[i] is not None and not done[i]:
                tok = int(nxt[i])
                if not matchers[i].accept_token(tok):
                    raise RuntimeError(f"grammar {refs[i]} refused sampled token {tok}: mask and matcher disagree")
                if matchers[i].is_terminated():
                    hit[i] = True
        stopped |= hit
        done |= hit | (rows.last_step == t)
        if bool(done.all()):
            break
        logits = run_continuation(policy, pp, cache, nxt[:, None], mask, t)[:, -1]
    ids = torch.stack(toks, 1).tolist()
    lp = torch.stack(lps, 1).tolist()
    m = mask.tolist()
    out: list[list[Sampled]] = []
    for span in rows.spans:
        mine = []
        for i in range(span.start, span.stop):
            k = sum(m[i])
            row_ids, row_lp = ids[i][:k], lp[i][:k]
            body = row_ids[:-1] if stopped[i] else row_ids  # the text leaves out the stop token, the ids keep it
            text = policy.tokenizer.decode(body, skip_special_tokens=False)
            finish = "stop" if stopped[i] else "length"
            mine.append(Sampled(text=text, token_ids=row_ids, logprobs=row_lp, finish_reason=finish))
        out.append(mine)
    return out
