"""The learner's worker serves the Python SDK's Prometheus metrics on HALO_METRICS_ADDRESS, with the series an
operator alerts on (schedule-to-start latency of the gpu queue, failures, free slots), tagged like the TypeScript
workers' series."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from halo_learner.connection import learner_runtime, temporal_settings


@activity.defn(name="ping")
def ping(x: int) -> int:
    return x + 1


@workflow.defn(name="pingTwice")
class PingTwice:
    @workflow.run
    async def run(self, queue: str) -> int:
        n = 0
        for _ in range(2):
            n = await workflow.execute_activity(
                "ping", n, task_queue=queue, start_to_close_timeout=timedelta(seconds=30)
            )
        return n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def test_the_learner_serves_sdk_metrics_on_halo_metrics_address(temporal_server):
    address = f"127.0.0.1:{free_port()}"
    env = {"TEMPORAL_ADDRESS": temporal_server, "HALO_METRICS_ADDRESS": address}
    queue = f"gpu-{uuid.uuid4().hex[:8]}"

    async def run() -> str:
        client = await Client.connect(**temporal_settings(env), runtime=learner_runtime(env))
        with ThreadPoolExecutor(2) as pool:
            async with Worker(
                client,
                task_queue=queue,
                activities=[ping],
                workflows=[PingTwice],
                activity_executor=pool,
                workflow_runner=UnsandboxedWorkflowRunner(),
            ):
                result = await client.execute_workflow(PingTwice.run, queue, id=f"ping-{queue}", task_queue=queue)
                assert result == 2
                return scrape(address)

    text = asyncio.run(run())
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    ours = [ln for ln in lines if f'task_queue="{queue}"' in ln]
    assert ours, text[:2000]
    assert all('halo_worker="learner"' in ln for ln in ours)

    def total(name: str) -> float:
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in ours if ln.startswith(name + "{"))

    assert total("temporal_activity_schedule_to_start_latency_count") == 2
    assert total("temporal_workflow_task_schedule_to_start_latency_count") >= 1
    assert total("temporal_activity_execution_failed") == 0
    assert any(ln.startswith("temporal_worker_task_slots_available{") for ln in ours)
