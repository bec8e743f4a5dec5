"""Feeds a sampler's token ids through the learner's grammar check (Grammars.completion_bitmask), for the TypeScript
test of the vLLM stand-in's constrained answers. Blobs under $HALO_HOME/blobs.

Usage: grammar-check.py              -> {"tokenizer": path of the tiny model's tokenizer.json} (built once)
       grammar-check.py PAIRS_JSON   -> PAIRS_JSON a list of [GRAMMAR_REF, TOKENS_REF]; prints {"results": [null or
                                        the GrammarMismatch message, ...], "widened": tokens accepted outside the mask}
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers" / "learner"))

from transformers import AutoTokenizer  # noqa: E402

from halo_learner.blobs import BlobStore  # noqa: E402
from halo_learner.grammar import GrammarMismatch, Grammars  # noqa: E402
from halo_learner.models import ensure_tiny_random  # noqa: E402
from halo_learner.paths import blob_root  # noqa: E402
from halo_learner.sampling import stop_ids  # noqa: E402

folder = ensure_tiny_random()
if len(sys.argv) == 1:
    print(json.dumps({"tokenizer": str(folder / "tokenizer.json")}))
    sys.exit(0)
pairs = json.loads(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(str(folder))
vocab = json.loads((folder / "config.json").read_text())["text_config"]["vocab_size"]
blobs = BlobStore(blob_root())
grammars = Grammars(tokenizer, vocab, sorted(stop_ids(tokenizer)), blobs)
results = []
for grammar_ref, tokens_ref in pairs:
    ids = json.loads(blobs.get(tokens_ref))["token_ids"]
    try:
        grammars.completion_bitmask(grammar_ref, ids)
        results.append(None)
    except GrammarMismatch as e:
        results.append(str(e))
print(json.dumps({"results": results, "widened": grammars.widened}))
