"""Samples completions from the colocated learner (tiny-random) under a grammar, for the TypeScript test that
parses them with the real parser. Usage: constrained-sample.py PROMPT_REF GRAMMAR_REF N ROUNDS MAX_TOKENS
(blobs under $HALO_HOME/blobs). Prints one JSON list of completion texts."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers" / "learner"))

import torch  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.learner import Learner, Settings  # noqa: E402
from halo_learner.models import load_policy  # noqa: E402
from halo_learner.paths import blob_root  # noqa: E402
from halo_learner.payloads import SampleActionsInput  # noqa: E402

torch.set_num_threads(1)
prompt_ref, grammar_ref, n, rounds, max_tokens = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
learner = Learner(load_policy("tiny-random"), blobs=BlobStore(blob_root()), settings=Settings())
texts, finish = [], []
for r in range(rounds):
    out = learner.sample_actions(
        SampleActionsInput(
            run_id="constrained-test",
            version=0,
            prompt_ref=prompt_ref,
            n=n,
            temperature=1.0,
            max_tokens=max_tokens,
            seed=r,
            grammar_ref=grammar_ref,
        )
    )
    texts += [c.text for c in out.completions]
    finish += [c.finish_reason for c in out.completions]
print(json.dumps({"texts": texts, "finish_reasons": finish}))
