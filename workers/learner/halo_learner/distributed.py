"""Data-parallel learner updates: k ranks, one Temporal worker in front, gradients all-reduced once per update.

HALO_LEARNER_GPUS=k (default 1: no process group, the single-process path as it always was). Rank 0 (the leader)
runs the Temporal worker; it starts ranks 1..k-1 (followers, `python -m halo_learner.worker` with
HALO_LEARNER_RANK set), each with the whole model on its own GPU. Per update (GRPO `update_policy`, DPO
`update_dpo`), through the rendezvous store, which carries only small JSON:

  1. the leader checks for an existing version and reads the batch, then posts the command (op, input, and which
     version the followers may keep in memory);
  2. every rank brings its adapter to the parent version and prepares the whole batch from the shared blob store;
  3. the leader posts the plan (chunk sizes, or the DPO chunks), or an abort when it failed before planning;
  4. each rank runs forward+backward over its shard: whole prompt groups (each one or more packed sequences),
     spread over the ranks by their token counts (`owners`), never split, so no prompt runs on two ranks;
  5. every rank posts its status (ok, out of memory, error, and a digest of the batch it prepared); one failure
     fails the update on every rank, as an out-of-memory error on the leader when any rank ran out of memory
     (so the retry halves the chunks everywhere);
  6. one all-reduce (sum) of the float32 LoRA gradients and one of the statistics; every rank clips and steps:
     identical gradients give identical weights and AdamW moments;
  7. the leader writes the version (the same files as on one GPU); the followers say they are done.

Why DDP over the LoRA parameters and not FSDP: on the 8B the trainable parameters are 43.6 M (175 MB in float32,
0.5 GB with AdamW's moments) and the frozen bf16 base (16.5 GiB) fits each GPU beside its activations, so every
rank keeps the whole model, adapter and optimiser state and only gradients travel: one 175 MB all-reduce per update
(a fraction of a second against ~10 s of compute). FSDP would shard what needs no sharding and add an all-gather of
the frozen weights before every layer of every pass (reference, forward, recompute, backward).
Why one all-reduce after the local backward and not torch's DistributedDataParallel wrapper: a rank runs a
batch-dependent number of chunks (possibly none), each its own backward into bf16 working copies whose gradients
are summed in float32 (grpo.LoraWorkingCopy). DDP reduces inside every backward, needs as many backward calls on
every rank and would reduce the bf16 copies. Every rank normalises its loss by the whole batch, so the float32 sum
over ranks is the single process's sum over chunks: the update, the optimiser state and the checkpoint are those of
one GPU, and a run can move between 1 and k GPUs across a restart.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

log = logging.getLogger("halo_learner.distributed")

POLL_S = 0.02  # how often a rank looks for the next message (one store round trip each)


class RankFailed(RuntimeError):
    """Another rank's part of the update failed; the update fails on every rank."""


def gpus_from_env(env=os.environ) -> int:
    return max(1, int(env.get("HALO_LEARNER_GPUS") or 1))


@dataclass
class Ranks:
    """This process's place among the learner's ranks, and the messages and collectives of an update."""

    rank: int
    world: int
    store: dist.Store
    device: torch.device
    seq: int = 0  # commands issued (leader) or taken (follower)
    followers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ---- messages, through the store: a follower may wait for work for hours, which no collective allows --------

    def put(self, key: str, value) -> None:
        self.store.set(key, json.dumps(value))

    def get(self, key: str, alive=None):
        """Waits for `key`; `alive()` False (a follower process gone) raises RankFailed meanwhile."""
        while not self.store.check([key]):
            if alive is not None and not alive():
                raise RankFailed(f"a learner rank exited while the others waited for {key}")
            time.sleep(POLL_S)
        return json.loads(self.store.get(key))

    def _followers_alive(self) -> bool:
        return all(p.poll() is None for p in self.followers)

    def announce(self, op: str, payload: dict, hold) -> None:
        """Leader: the next command, once every follower is done with the previous one."""
        for r in range(1, self.world):
            if self.seq:
                self.get(f"done/{self.seq}/{r}", self._followers_alive)
        if self.seq:
            for key in [f"cmd/{self.seq}", f"plan/{self.seq}", *(f"status/{self.seq}/{r}" for r in range(self.world))]:
                self.store.delete_key(key)
            for r in range(1, self.world):
                self.store.delete_key(f"done/{self.seq}/{r}")
        self.seq += 1
        self.put(f"cmd/{self.seq}", {"op": op, "input": payload, "hold": hold})

    def next_command(self) -> dict:
        """Follower: waits for the leader's next command."""
        self.seq += 1
        return self.get(f"cmd/{self.seq}")

    def post_plan(self, plan) -> None:
        if self.leader:
            self.put(f"plan/{self.seq}", plan)

    def plan(self):
        """Follower: the leader's plan for the current command (None: the leader gave up before planning)."""
        return self.get(f"plan/{self.seq}")

    def done(self) -> None:
        if not self.leader:
            self.put(f"done/{self.seq}/{self.rank}", True)

    def settle(self, error: BaseException | None, digest: str) -> None:
        """Every rank's outcome of its shard; raises on every rank when any failed or the batches differ."""
        oom = isinstance(error, torch.OutOfMemoryError)
        text = "" if error is None else f"{type(error).__name__}: {error}".splitlines()[0][:500]
        self.put(f"status/{self.seq}/{self.rank}", {"ok": error is None, "oom": oom, "error": text, "digest": digest})
        alive = self._followers_alive if self.leader else None
        status = [self.get(f"status/{self.seq}/{r}", alive) for r in range(self.world)]
        if error is not None:
            raise error
        failed = [(r, s) for r, s in enumerate(status) if not s["ok"]]
        if any(s["oom"] for _, s in failed):
            r = next(r for r, s in failed if s["oom"])
            raise torch.OutOfMemoryError(f"learner rank {r}: {status[r]['error']}")
        if failed:
            r, s = failed[0]
            raise RankFailed(f"learner rank {r}: {s['error']}")
        if len({s["digest"] for s in status}) > 1:
            raise RankFailed(
                "the learner's ranks prepared different batches: " + ", ".join(s["digest"] for s in status)
            )

    # ---- collectives, run by every rank at the same point of an update ------------------------------------------

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum of every rank's float32 gradient, into each rank's .grad (one flat all-reduce)."""
        flat = torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self.device, torch.float32)
                for p in params
            ]
        )
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.device, p.dtype)
            offset += n

    def sum(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: list[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: list[float], op) -> list[float]:
        if not values:
            return []
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def close(self) -> None:
        """Leader: followers stop after the current command; the process group ends."""
        if self.leader and self.world > 1:
            try:
                self.announce("stop", {}, None)
                for r in range(1, self.world):  # the store lives in this process: it must outlast their last read
                    self.get(f"done/{self.seq}/{r}", self._followers_alive)
            except Exception as e:  # noqa: BLE001 - a follower already gone stops anyway
                log.warning("stopping the learner's followers: %s", e)
            for p in self.followers:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        if dist.is_initialized():
            dist.destroy_process_group()


def owners(costs: list[float], world: int) -> list[int]:
    """The rank of each unit (prompt group): longest first, each to the least loaded rank (ties: the lowest rank).
    Deterministic, so every rank computes the same assignment from the same batch."""
    load = [0.0] * world
    out = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        out[i] = r
        load[r] += costs[i]
    return out


def digest(shapes) -> str:
    """A short fingerprint of what a rank prepared (lengths per sample), compared across ranks at settle time."""
    return hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(
    rank: int, world: int, address: str, device: torch.device, backend: str | None = None, timeout_s: float = 1800
) -> Ranks:
    """Joins (rank 0: hosts) the store at `address` (host:port) and the process group over it. NCCL on GPUs, gloo
    on the CPU. The timeout covers the slowest rank loading its model before the group forms."""
    host, port = address.rsplit(":", 1)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, int(port), world, rank == 0, timeout=timeout)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world, timeout=timeout)
    return Ranks(rank=rank, world=world, store=dist.PrefixStore("halo", store), device=device)


def rank_device(rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", rank)
    return torch.device("cpu")


def spawn_followers(world: int) -> tuple[str, list[subprocess.Popen]]:
    """Leader: the store's address and ranks 1..world-1 started as worker processes of their own."""
    address = os.environ.get("HALO_LEARNER_MASTER") or f"127.0.0.1:{_free_port()}"
    procs = []
    for r in range(1, world):
        env = dict(os.environ, HALO_LEARNER_RANK=str(r), HALO_LEARNER_GPUS=str(world), HALO_LEARNER_MASTER=address)
        procs.append(subprocess.Popen([sys.executable, "-m", "halo_learner.worker"], env=env))
    return address, procs


def watch_followers(ranks: Ranks, on_exit) -> threading.Thread:
    """Leader: a follower that exits leaves every update waiting on it; `on_exit` (restart the learner) instead."""

    def loop() -> None:
        while True:
            for r, p in enumerate(ranks.followers, start=1):
                if p.poll() is not None:
                    log.error("learner rank %d exited with %s; restarting the learner", r, p.returncode)
                    on_exit()
                    return
            time.sleep(1.0)

    t = threading.Thread(target=loop, name="learner-followers", daemon=True)
    t.start()
    return t
