"""The sandbox's inference side on loopback, without a whole sandbox: the Kubernetes
emulator (in this process, leaving the inference pods to an external kubelet), the inference
kubelet and gateway as the sandbox starts them (processes recorded by PID), and the servers
the kubelet starts for the inference Deployment's pods."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autoclusters.core.sharing import POOL_LABEL
from autoclusters.sandbox.drivers.load import Load
from autoclusters.sandbox.inference import launch as inference_sandbox
from autoclusters.sandbox.inference import pods as inference_pods
from autoclusters.sandbox.inference.kubelet import SERVER_PREFIX
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable, wait_until
from tests.conftest import free_port_base
from tests.helpers import eventually

pytestmark = pytest.mark.integration
TOKEN = "test-token"
NS, DEPLOY = inference_sandbox.NAMESPACE, inference_sandbox.DEPLOYMENT


@dataclass
class Stack:
    cfg: SandboxConfig
    emu: Running
    table: ProcessTable
    k8s: httpx.Client

    def scale(self, replicas: int) -> None:
        self.k8s.patch(
            f"/apis/apps/v1/namespaces/{NS}/deployments/{DEPLOY}/scale",
            json={"spec": {"replicas": replicas}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()

    def pods(self) -> list[dict[str, Any]]:
        r = self.k8s.get(f"/api/v1/namespaces/{NS}/pods")
        r.raise_for_status()
        items: list[dict[str, Any]] = r.json()["items"]
        return items

    def servers(self) -> list[str]:
        return [
            r.name
            for r in self.table.records()
            if r.name.startswith(SERVER_PREFIX) and self.table.alive(r.name)
        ]

    def gateway(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.cfg.inference_gateway_url}{path}", timeout=5)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of the gateway's /metrics (`labels` as Prometheus prints them)."""
        want = f"{name}{{{labels}}}" if labels else name
        for line in self.gateway("/metrics").text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0


def _lend(emu: Running, node: str) -> None:
    httpx.post(
        f"{emu.url}/_emulator/nodes",
        json={"name": node, "provider_id": f"crusoe://{node}", "gpus": 8,
              "register_labels": {POOL_LABEL: "inference"}},
        timeout=5,
    ).raise_for_status()  # fmt: skip


@pytest.fixture
def stack_factory(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    started: list[Stack] = []

    def start(ms_per_request: float = 100, nodes: int = 1) -> Stack:
        cfg = SandboxConfig(state_dir=tmp_path / "sandbox", port_base=free_port_base(), k8s=True)
        cfg.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        (cfg.state_dir / "monitoring").mkdir(parents=True, exist_ok=True)
        ctx = running(TOKEN, external_kubelet=inference_pods.SELECTOR)
        emu = ctx.__enter__()
        cfg.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emu", "cluster": {"server": emu.url}}],
                    "users": [{"name": "emu", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                    "current-context": "emu",
                }
            )
        )
        for i in range(1, nodes + 1):
            _lend(emu, f"gpu-{i:02d}")
        inference_sandbox.seed(cfg, url=emu.url, token=TOKEN)
        table = ProcessTable(cfg.state_dir)
        k8s = httpx.Client(
            base_url=emu.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
        )
        stack = Stack(cfg, emu, table, k8s)
        stack._ctx = ctx  # type: ignore[attr-defined]
        started.append(stack)
        table.spawn(
            inference_sandbox.KUBELET,
            inference_sandbox.kubelet_argv(cfg) + ["--ms-per-request", str(ms_per_request)],
        )
        table.spawn(inference_sandbox.GATEWAY, inference_sandbox.gateway_argv(cfg))
        assert wait_until(lambda: inference_sandbox.gateway_ready(cfg), 30), table.log_tail(
            inference_sandbox.GATEWAY
        )
        return stack

    yield start
    for stack in started:
        for name in (inference_sandbox.GATEWAY, inference_sandbox.KUBELET):
            stack.table.stop(name)
        for rec in stack.table.records():
            stack.table.stop(rec.name)
        assert not [r for r in stack.table.records() if stack.table.alive(r.name)]
        stack.k8s.close()
        stack._ctx.__exit__(None, None, None)  # type: ignore[attr-defined]


async def _serving(stack: Stack, replicas: int) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        ready = [p for p in stack.pods() if inference_pods.serving(p)]
        routed = stack.gateway("/v1/status").json()["replicas"]
        ok = len(ready) == replicas and len([r for r in routed if r["serving"]]) == replicas
        return ready if ok else None

    return await eventually(check, 60, f"{replicas} replica(s) serving")


async def _infer(n: int, url: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as c:
        return await asyncio.gather(*(c.post(f"{url}/v1/infer", json={"i": i}) for i in range(n)))


async def test_a_scheduled_pod_serves_and_drains_without_failing_a_request(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory(ms_per_request=2500)
    url = stack.cfg.inference_gateway_url
    assert stack.servers() == [] and stack.pods() == []
    stack.scale(1)
    (pod,) = await _serving(stack, 1)
    assert pod["spec"]["nodeName"] == "gpu-01"
    assert len(stack.servers()) == 1
    assert stack.metric("inference_ready_replicas") == 1
    # Four requests fill the replica's slots; while they are in flight, its pod is deleted.
    inflight = asyncio.ensure_future(_infer(4, url))
    await eventually(
        lambda: _async(stack.metric("inference_inflight_requests") == 4), 30, "4 in flight"
    )
    stack.scale(0)
    (gone,) = stack.pods()
    assert gone["metadata"].get("deletionTimestamp"), "Terminating while it drains"
    answers = await inflight
    assert [r.status_code for r in answers] == [200] * 4
    assert {r.json()["node"] for r in answers} == {"gpu-01"}
    await eventually(lambda: _async(not stack.pods() and not stack.servers()), 30, "pod gone")
    assert stack.metric("inference_requests_total", 'code="200"') == 4
    assert stack.metric("inference_ready_replicas") == 0


async def test_queueing_raises_the_latency_histogram(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory(ms_per_request=400)
    url = stack.cfg.inference_gateway_url
    stack.scale(1)
    await _serving(stack, 1)
    # Twelve at once on four slots: four served at once, eight queued (two more rounds).
    burst = asyncio.ensure_future(_infer(12, url))
    await eventually(lambda: _async(stack.metric("inference_queue_length") > 0), 30, "a queue")
    answers = await burst
    assert [r.status_code for r in answers] == [200] * 12
    assert stack.metric("inference_request_duration_seconds_count") == 12
    fast = stack.metric("inference_request_duration_seconds_bucket", 'le="0.75"')
    slow = 12 - stack.metric("inference_request_duration_seconds_bucket", 'le="1.0"')
    assert fast <= 4 and slow >= 4, (fast, slow)  # the third round waited two services
    assert stack.metric("inference_queue_length") == 0


async def test_the_load_generator_keeps_its_rate(stack_factory: Callable[..., Stack]) -> None:
    stack = stack_factory(ms_per_request=50)
    stack.scale(1)
    await _serving(stack, 1)
    load = Load(stack.cfg.inference_gateway_url, rps=25, seed=7)
    stats = await load.run_for(4)
    summary = stats.summary()
    assert stats.errors == 0 and stats.ok == stats.sent, summary
    # The rate over the window it sent in: the drain of the last answers after it is the
    # service's time (a starved machine drained for 8 s after 4 s of sending).
    assert summary["sending_s"] <= summary["elapsed_s"], summary
    assert 25 * 0.7 <= summary["achieved_rps"] <= 25 * 1.3, summary
    assert summary["p50_s"] is not None and summary["p50_s"] >= 0.05, summary
    assert stack.metric("inference_requests_total", 'code="200"') == stats.ok
    # The CLI, on the sandbox's state dir, prints what it achieved.
    stack.cfg.save()
    cli = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "autoclusters.clients.cli", "sandbox", "load", "--rps", "10",
        "--for", "2", "--state-dir", str(stack.cfg.state_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await cli.communicate())[0].decode()
    assert cli.returncode == 0, out
    assert re.search(r"sent \d+ in 2\.\d+s: [\d.]+ rps; ok \d+, errors 0; p50 \d+ ms", out), out


async def _async(value: bool) -> bool:
    return value
