"""Start the learner: load the model once, then serve the `gpu` task queue: one update at a time, sampling calls
that arrive together as one batch (sample_batcher.py).

    PYTHONPATH=workers/learner .venv/bin/python -m halo_learner.worker

Environment: HALO_MODEL (HF id, local path or "tiny-random"), HALO_HOME, HALO_CHECKPOINTS, HALO_GPU_QUEUE,
the Temporal profile (temporal.toml, TEMPORAL_*: connection.py), HALO_METRICS_ADDRESS (Prometheus), HALO_MICRO_BATCH, HALO_PREFIX_SHARING,
HALO_LORA_RANK/ALPHA/SEED, HALO_SAMPLE_BATCH (sampling calls batched at most: 8 on a GPU, 1 on the CPU),
HALO_SAMPLE_BATCH_ROWS (32: completions in one batch at most), HALO_SAMPLE_WINDOW_MS (20: how long a batch waits
for calls arriving together). SIGTERM/SIGINT drain the running activity (up to HALO_SHUTDOWN_GRACE_S) and exit. HALO_WATCHDOG_GRACE_S
(30): how long past an activity's timeout the slot may stay busy before the learner restarts itself (watchdog.py).
HALO_LEARNER_GPUS (1): data-parallel updates over that many GPUs (distributed.py); this process is rank 0 and the
only Temporal worker, and starts the other ranks itself (follower.py).
An activity a killed predecessor left running is failed at startup (halo_learner/inflight.py), so its retry
starts at once rather than after the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Callable

from temporalio.client import Client
from temporalio.worker import Worker

from .activities import LearnerActivities
from .connection import learner_runtime, temporal_settings
from .distributed import connect, gpus_from_env, rank_device, spawn_followers, watch_followers
from .envfile import load_dotenv
from .inflight import InflightLedger, release_orphan
from .follower import follow
from .models import load_policy, tiny_seed
from .learner import Learner
from .paths import halo_home
from .prompt_text import unlisted_added_tokens
from .watchdog import SlotWatch, Watchdog, event_path, restart_in_place

log = logging.getLogger("halo_learner.worker")


def worker_identity(learner: Learner) -> str:
    """`<pid>@<host> halo-learner model=<id> device=<cpu|cuda[:i]> [gpu=<name>]`: `halo doctor` reads the model and
    device from the poller list of the gpu queue."""
    device = learner.policy.device
    ident = f"{os.getpid()}@{socket.gethostname()} halo-learner model={learner.policy.model_id} device={device}"
    if device.type == "cuda":
        import torch

        ident += " gpu=" + torch.cuda.get_device_name(device).replace(" ", "_")
    return ident


def build_worker(
    client: Client, queue: str, acts: LearnerActivities, pool: ThreadPoolExecutor, identity: str, watch: SlotWatch
) -> Worker:
    """The learner's worker: an update alone or up to a batch of sampling calls at once (`acts.slots`, one executor
    thread each), every slot under the watchdog's eye."""
    return Worker(
        client,
        task_queue=queue,
        activities=acts.all(),
        activity_executor=pool,
        max_concurrent_activities=acts.slots,
        identity=identity,
        interceptors=[watch.interceptor()],
        graceful_shutdown_timeout=timedelta(seconds=float(os.environ.get("HALO_SHUTDOWN_GRACE_S", 60))),
    )


async def serve(learner: Learner | Callable[[], Learner], task_queue: str | None = None) -> None:
    """Serves the queue; `learner` may be a factory, called after a dead predecessor's attempt is released
    (loading an 8B model takes a while, and the retry can be queued meanwhile)."""
    settings = temporal_settings(os.environ)
    queue = task_queue or os.environ.get("HALO_GPU_QUEUE") or "gpu"
    client = await Client.connect(**settings, runtime=learner_runtime(os.environ))
    ledger = InflightLedger(halo_home() / "learner", queue)
    released = await release_orphan(client, ledger)
    if released:
        log.warning(released)
        print(f"halo-learner: {released}", flush=True)
    if not isinstance(learner, Learner):
        learner = await asyncio.get_running_loop().run_in_executor(None, learner)
    unlisted = unlisted_added_tokens(learner.policy.tokenizer)
    if unlisted:
        log.warning(
            "the tokenizer adds tokens that lib/model-io/prompt-text.ts does not list: %s; the learner neutralises them "
            "in what it encodes, but prompts sent to a served model keep them",
            unlisted,
        )
    # Before any update writes a blob: `halo gc` must read this namespace to sweep a store it writes to.
    learner.blobs.record_writer(settings["namespace"], settings["target_host"], socket.gethostname())
    acts = LearnerActivities(learner, ledger)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = SlotWatch()
    Watchdog.from_env(watch, event_path(ledger.directory, queue)).start()
    with ThreadPoolExecutor(max_workers=acts.slots, thread_name_prefix="learner") as pool:
        worker = build_worker(client, queue, acts, pool, worker_identity(learner), watch)
        log.info(
            "learner ready: model=%s queue=%s address=%s namespace=%s",
            learner.policy.model_id,
            queue,
            settings["target_host"],
            settings["namespace"],
        )
        b = acts.batcher.batching
        batching = f"up to {b.calls} calls, {b.rows} completions" if b.calls > 1 else "one call at a time"
        print(f"halo-learner ready queue={queue} model={learner.policy.model_id} sampling={batching}", flush=True)
        async with worker:
            await stop.wait()
            log.info("shutting down")
    if learner.ranks is not None:
        learner.ranks.close()


def learner_factory(env=os.environ) -> Callable[[], Learner]:
    """Learner.from_env on one GPU; with HALO_LEARNER_GPUS=k, this rank's learner on its own GPU, joined to the
    others (rank 0 starts ranks 1..k-1 first, so they load their models while it loads its own)."""
    world = gpus_from_env(env)
    if world == 1:
        return Learner.from_env
    rank = int(env.get("HALO_LEARNER_RANK") or 0)
    if rank == 0:
        address, procs = spawn_followers(world)
    else:
        address, procs = env["HALO_LEARNER_MASTER"], []

    def make() -> Learner:
        device = rank_device(rank)
        policy = load_policy(device=device)
        ranks = connect(rank, world, address, device)
        ranks.followers = procs
        if rank == 0:

            def restart() -> None:
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                restart_in_place()

            watch_followers(ranks, restart)
        return Learner(policy, ranks=ranks)

    return make


def main() -> int:
    load_dotenv()
    logging.basicConfig(
        level=os.environ.get("HALO_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    import torch

    torch_threads = os.environ.get("HALO_TORCH_THREADS")
    if not torch_threads and not torch.cuda.is_available() and tiny_seed(os.environ.get("HALO_MODEL")) is not None:
        # The tiny model's matrices are too small to share between threads, and on a machine whose cores also
        # run Chromium and Temporal, spinning worker threads made each sampling call an order of magnitude slower.
        torch_threads = "1"
    if torch_threads:
        torch.set_num_threads(int(torch_threads))
    make = learner_factory()
    if int(os.environ.get("HALO_LEARNER_RANK") or 0) > 0:
        learner = make()
        follow(learner)
        learner.ranks.close()
        return 0
    asyncio.run(serve(make))
    return 0


if __name__ == "__main__":
    sys.exit(main())
