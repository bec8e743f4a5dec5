"""The learner benches' data-parallel runs: one process per GPU (CPU with --smoke), each with its own model, joined
through halo_learner.distributed as the learner's ranks are; rank 0 prints."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers" / "learner"))

from halo_learner.blobs import BlobStore  # noqa: E402


def broadcast(value, ranks):
    """Rank 0's value on every rank (plans, so that no rank shards another batch layout)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, device=ranks.device if ranks.device.type == "cuda" else None)
    return box[0]


def _rank_main(rank: int, world: int, address: str, smoke: bool, body, build) -> None:
    from halo_learner.distributed import connect

    if rank:  # one report: rank 0's
        sys.stdout = open(os.devnull, "w")
    torch.set_num_threads(2 if smoke else 4)
    device = torch.device("cuda", rank) if not smoke else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    t0 = time.perf_counter()
    policy = build(smoke, device)
    print(f"rank {rank}: model built in {time.perf_counter() - t0:.1f}s", flush=True)
    ranks = connect(rank, world, address, device, timeout_s=900)
    try:
        body(policy, BlobStore(tempfile.mkdtemp(prefix=f"halo-bench-blobs-{rank}-")), ranks)
    finally:  # every rank runs the whole bench, none follows commands: no stop message, just leave the group
        import torch.distributed as dist

        dist.destroy_process_group()


def run_ranks(args, body, build) -> int:
    """`body(policy, blobs, ranks)` on args.ranks processes (one GPU each; CPU with --smoke) over the learner's
    data-parallel path; --ranks 1 runs it in this process, through the same process group and collectives."""
    from halo_learner.distributed import _free_port

    address = f"127.0.0.1:{_free_port()}"
    if args.ranks == 1:
        _rank_main(0, 1, address, args.smoke, body, build)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(args.ranks, address, args.smoke, body, build), nprocs=args.ranks)
    return 0
