#!/usr/bin/env python
"""Cost of constrained decoding per sampled token: the colocated sampler with and without the action grammar.

    .venv/bin/python bench/constrained_decoding.py            # tiny-random on CPU (the default job's learner)
    .venv/bin/python bench/constrained_decoding.py --rounds 20

Same prompt (a screenshot and the click-button page's tree), same n, interleaved rounds; the unconstrained
sampler runs to the same number of tokens per row as the constrained one produced (max_tokens = its longest),
so the ratio compares time per sampled token, not completion lengths.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "workers" / "learner"))
sys.path.insert(0, str(ROOT / "workers" / "learner" / "tests"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.learner import Learner, Settings  # noqa: E402
from halo_learner.models import load_policy  # noqa: E402
from halo_learner.payloads import SampleActionsInput  # noqa: E402

SCHEMA = json.loads((ROOT / "workers/learner/tests/fixtures/action-schema.json").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n", type=int, default=4, help="samples per call (train.numGenerations)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from conftest import messages, png_ref

    tmp = Path(tempfile.mkdtemp(prefix="halo-constrained-bench-"))
    blobs = BlobStore(tmp / "blobs")
    learner = Learner(load_policy("tiny-random"), blobs=blobs, checkpoints=tmp / "ckpt", settings=Settings())
    prompt_ref = blobs.put_json(messages(png_ref(blobs, 1280, 720, 1), "Goal: Click the button."))
    grammar_ref = blobs.put_json(SCHEMA)
    per_token = {"constrained": [], "unconstrained": []}
    for r in range(args.rounds + 1):
        t0 = time.perf_counter()
        out = learner.sample_actions(
            SampleActionsInput(
                run_id="bench",
                prompt_ref=prompt_ref,
                n=args.n,
                temperature=1.0,
                max_tokens=128,
                seed=r,
                grammar_ref=grammar_ref,
            )
        ).completions
        tc = time.perf_counter() - t0
        longest = max(len(c.token_ids) for c in out)
        t0 = time.perf_counter()
        free = learner.sample_actions(
            SampleActionsInput(
                run_id="bench", prompt_ref=prompt_ref, n=args.n, temperature=1.0, max_tokens=longest, seed=r
            )
        ).completions
        tu = time.perf_counter() - t0
        if r == 0:
            continue  # warm-up: compiles the grammar, fills caches
        per_token["constrained"].append(tc / sum(len(c.token_ids) for c in out))
        per_token["unconstrained"].append(tu / sum(len(c.token_ids) for c in free))
    c, u = statistics.median(per_token["constrained"]), statistics.median(per_token["unconstrained"])
    print(f"colocated sampler, tiny-random on CPU ({args.threads} thread), n={args.n}, {args.rounds} rounds (medians)")
    print(f"  constrained:   {c * 1e3:.2f} ms per sampled token")
    print(f"  unconstrained: {u * 1e3:.2f} ms per sampled token")
    print(f"  ratio constrained / unconstrained: {c / u:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
