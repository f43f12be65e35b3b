"""The sandbox's kubelet for inference pods: one process for every node.

It watches the emulated API's inference pods and nodes (`--external-kubelet` on the
emulator leaves the pods to it), makes a pass at each change and every `--poll` seconds
without one (sandbox/inference/changes.py; the lists are read again at each change, and
every RESYNC_S without one), and, like a node's kubelet:

- a pod bound to a node and not yet started: starts its inference server (a process
  recorded by PID in the sandbox's ProcessTable, `inference-server-<ns>.<pod>`), writes the
  server's port on the pod (`sandbox.autoclusters.io/port`), and reports it Ready once its
  `/healthz` (the readinessProbe) answers;
- a server that died under a live pod: marked not Ready and started again;
- a pod with a deletionTimestamp: SIGTERMs its server (which finishes the requests in
  flight), waits up to the pod's grace period for it to exit (then SIGKILL), and finishes
  the deletion (`POST /_emulator/pods/{ns}/{name}/terminated`);
- a server whose pod is gone (its node was deleted, or the pod force-deleted): stopped;
- a pod on a NotReady node: left alone (that node's kubelet is down), as the emulator's
  own kubelet does.

A restarted kubelet adopts the servers still running. With `--file-sd F` it keeps F, a
Prometheus file_sd list of the servers' /metrics (label `node`), up to date.

Run: `python -m autoclusters.sandbox.inference.kubelet --kubeconfig K --state-dir D
[--slots 4] [--ms-per-request 100] [--poll 1] [--file-sd F]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx

from autoclusters.sandbox.inference import pods
from autoclusters.sandbox.inference.changes import Changes
from autoclusters.sandbox.inference.server import DEFAULT_MS_PER_REQUEST, DEFAULT_SLOTS
from autoclusters.sandbox.runtime.processes import ProcessTable

log = logging.getLogger("inference-kubelet")
SERVER_PREFIX = "inference-server-"
START_TIMEOUT_S = 60.0
# A pass without a change: a server that died under its pod is started again within this.
POLL_S = 1.0
# The pods and nodes are read again at each watch event, and after this without one (an
# event a watch missed while it reconnected); the passes between, every POLL_S, run on the
# last read, for what the API does not hold (a server that died). Read every POLL_S, those
# lists were most of an idle Kubernetes-mode sandbox's API emulator CPU (issue 41).
RESYNC_S = 10.0


def server_name(pod: pods.Pod) -> str:
    return f"{SERVER_PREFIX}{pod['metadata']['namespace']}.{pod['metadata']['name']}"


def server_argv(node: str, port_file: Path, slots: int, ms_per_request: float) -> list[str]:
    return [
        sys.executable, "-m", "autoclusters.sandbox.inference.server", "--node", node,
        "--port", "0", "--port-file", str(port_file), "--slots", str(slots),
        "--ms-per-request", str(ms_per_request),
    ]  # fmt: skip


class Kubelet:
    def __init__(
        self,
        access: pods.Access,
        state_dir: Path,
        *,
        slots: int = DEFAULT_SLOTS,
        ms_per_request: float = DEFAULT_MS_PER_REQUEST,
        poll_s: float = POLL_S,
        file_sd: Path | None = None,
    ) -> None:
        self.access, self.table = access, ProcessTable(state_dir)
        self.port_dir = state_dir / "inference"
        self.slots, self.ms, self.poll_s, self.file_sd = slots, ms_per_request, poll_s, file_sd
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._sd_written: str | None = None
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        self.port_dir.mkdir(parents=True, exist_ok=True)
        watched = {"/api/v1/pods": {"labelSelector": pods.SELECTOR}, "/api/v1/nodes": {}}
        async with (
            self.access.client() as k8s,
            httpx.AsyncClient(timeout=2) as probe,
            Changes(k8s, watched) as changes,
        ):
            loop = asyncio.get_running_loop()
            seen: tuple[list[pods.Pod], set[str]] | None = None
            read_at, woken = -math.inf, True
            while not self.stopping.is_set():
                try:
                    if woken or seen is None or loop.time() - read_at >= RESYNC_S:
                        seen, read_at = await self.read(k8s), loop.time()
                    self.sync(k8s, probe, *seen)
                except httpx.HTTPError as e:
                    seen = None  # read again at the next pass
                    log.warning("cannot reach the Kubernetes API: %s", e)
                woken = bool(await _first(changes.wait(self.poll_s), self.stopping.wait()))
            # A kubelet going away leaves its pods' servers running (a restart adopts them).
            for task in self._tasks.values():
                task.cancel()

    async def read(self, k8s: httpx.AsyncClient) -> tuple[list[pods.Pod], set[str]]:
        """The inference pods, and the names of the Ready nodes."""
        listed = await pods.list_pods(k8s)
        r = await k8s.get("/api/v1/nodes")
        r.raise_for_status()
        return listed, {n["metadata"]["name"] for n in r.json()["items"] if pods.is_ready(n)}

    def sync(
        self, k8s: httpx.AsyncClient, probe: httpx.AsyncClient, listed: list[pods.Pod], up: set[str]
    ) -> None:
        """One pass over the inference pods as last read (and the servers whose pods are
        gone): what it finds to do runs as tasks."""
        self._tasks = {k: t for k, t in self._tasks.items() if not t.done()}
        names = set()
        for pod in listed:
            name = server_name(pod)
            names.add(name)
            if name in self._tasks or pod["spec"].get("nodeName") not in up:
                continue  # unscheduled, or its node's kubelet is down: nothing happens
            if pods.terminating(pod):
                self._tasks[name] = asyncio.create_task(self._terminate(k8s, pod))
            elif (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            elif not self.table.alive(name) or pods.port(pod) is None:
                self._tasks[name] = asyncio.create_task(self._start(k8s, probe, pod))
            elif not pods.is_ready(pod) and pods.port(pod) is not None:
                self._tasks[name] = asyncio.create_task(self._probe(k8s, probe, pod))
        for rec in self.table.records():
            if rec.name.startswith(SERVER_PREFIX) and rec.name not in names:
                if rec.name not in self._tasks:
                    self._tasks[rec.name] = asyncio.create_task(self._orphan(rec.name))
        self._write_file_sd(listed)

    async def _start(self, k8s: httpx.AsyncClient, probe: httpx.AsyncClient, pod: pods.Pod) -> None:
        name, meta = server_name(pod), pod["metadata"]
        ns, pod_name, node = meta["namespace"], meta["name"], pod["spec"]["nodeName"]
        if pods.is_ready(pod):  # its server died: not Ready until the new one answers
            await self._ready(k8s, pod, ready=False)
        port_file = self.port_dir / f"{ns}.{pod_name}.port"
        if not self.table.alive(name):  # else: started, its port not yet on the pod
            port_file.unlink(missing_ok=True)
            argv = server_argv(node, port_file, self.slots, self.ms)
            await asyncio.to_thread(self.table.spawn, name, argv)
            log.info("%s/%s on %s: server started", ns, pod_name, node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not port_file.exists():
            if loop.time() > deadline or not self.table.alive(name):
                log.warning("%s/%s: server did not start:\n%s", ns, pod_name,
                            self.table.log_tail(name))  # fmt: skip
                await asyncio.to_thread(self.table.stop, name, 2)
                return
            await asyncio.sleep(0.05)
        port = json.loads(port_file.read_text())["port"]
        r = await k8s.patch(
            f"/api/v1/namespaces/{ns}/pods/{pod_name}",
            json={"metadata": {"annotations": {
                pods.PORT_ANNOTATION: str(port), pods.SLOTS_ANNOTATION: str(self.slots)}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )  # fmt: skip
        if r.status_code == 404:  # deleted meanwhile: the next pass stops the orphan
            return
        r.raise_for_status()
        await self._probe(k8s, probe, r.json())

    async def _probe(self, k8s: httpx.AsyncClient, probe: httpx.AsyncClient, pod: pods.Pod) -> None:
        """The readinessProbe: /healthz until it answers 200, then Ready."""
        port = pods.port(pod)
        name = server_name(pod)
        while port is not None and self.table.alive(name):
            try:
                if (await probe.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                    await self._ready(k8s, pod, ready=True)
                    log.info("%s Ready on port %d", pods.key(pod), port)
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)

    async def _ready(self, k8s: httpx.AsyncClient, pod: pods.Pod, *, ready: bool) -> None:
        meta = pod["metadata"]
        r = await k8s.post(
            f"/_emulator/pods/{meta['namespace']}/{meta['name']}/ready", json={"ready": ready}
        )
        if r.status_code != 404:
            r.raise_for_status()

    async def _terminate(self, k8s: httpx.AsyncClient, pod: pods.Pod) -> None:
        name, meta = server_name(pod), pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds") or 30)
        log.info("%s terminating: SIGTERM, up to %.0fs", pods.key(pod), grace)
        await asyncio.to_thread(self.table.stop, name, grace)
        (self.port_dir / f"{meta['namespace']}.{meta['name']}.port").unlink(missing_ok=True)
        r = await k8s.post(f"/_emulator/pods/{meta['namespace']}/{meta['name']}/terminated")
        if r.status_code not in (404, 409):
            r.raise_for_status()
        log.info("%s terminated", pods.key(pod))

    async def _orphan(self, name: str) -> None:
        log.info("%s: its pod is gone; stopping it", name)
        await asyncio.to_thread(self.table.stop, name, 30)

    def _write_file_sd(self, listed: list[pods.Pod]) -> None:
        if self.file_sd is None:
            return
        targets = [
            {"targets": [f"127.0.0.1:{pods.port(p)}"],
             "labels": {"node": p["spec"]["nodeName"], "pod": p["metadata"]["name"]}}
            for p in listed
            if pods.port(p) is not None and p["spec"].get("nodeName") and not pods.terminating(p)
        ]  # fmt: skip
        text = json.dumps(targets, indent=1)
        if text != self._sd_written:
            self.file_sd.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.file_sd.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(self.file_sd)
            self._sd_written = text


async def _first(*waits: Coroutine[Any, Any, Any]) -> Any:
    """What the first of `waits` to return returns; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return next(iter(done)).result()
    finally:
        for task in tasks:
            task.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autoclusters.sandbox.inference.kubelet")
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True, help="the sandbox's state dir")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS)
    parser.add_argument("--ms-per-request", type=float, default=DEFAULT_MS_PER_REQUEST)
    parser.add_argument(
        "--poll", type=float, default=POLL_S, help="seconds between passes without a change"
    )
    parser.add_argument("--file-sd", type=Path, help="Prometheus file_sd list of the servers")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # A line for every request of its passes and probes: a log that grew each second idle.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    kubelet = Kubelet(
        pods.Access.from_kubeconfig(args.kubeconfig),
        args.state_dir,
        slots=args.slots,
        ms_per_request=args.ms_per_request,
        poll_s=args.poll,
        file_sd=args.file_sd,
    )

    async def run() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, kubelet.stopping.set)
        await kubelet.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
