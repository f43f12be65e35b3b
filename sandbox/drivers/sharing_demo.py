"""`autoclusters demo --scenario share`: GPU nodes lent to inference and back, on the sandbox.

The sandbox comes up in Kubernetes mode; the cluster's GpuSharing starts with a demo
policy; one node is moved to inference by hand (the initial split, through the same
workflow); a training job runs on every other node (`--nodes=MIN-MAX`: it may run narrower
and grows back when requeued). Then inference load rises past one replica's capacity: the
SLO is breached, the sharing workflow lends a training node (the job checkpoints, requeues and
runs narrower), the new replica serves. The load falls: the node returns through the
health gate, and the job is requeued to regrow to full width.

Throughout, every node is sampled: Slurm jobs on it and inference pods on it, never both.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
from kubernetes import client as k8s_client
from pydantic import BaseModel, Field
from rich.console import Console
from temporalio.client import Client

from autoclusters.activities.sharing_demand import prometheus_value
from autoclusters.clients.sharing import request_move, share_status, start_sharing
from autoclusters.core import hostlist
from autoclusters.core.models import SlurmJob
from autoclusters.core.settings import load_file
from autoclusters.core.sharing import (
    BY_SHARING,
    INFERENCE_APP,
    INFERENCE_APP_LABEL,
    InferenceTarget,
    MoveRecord,
    MoveRequest,
    Pool,
    SharePolicy,
    ShareStatus,
)
from autoclusters.integrations import k8s, temporal
from autoclusters.integrations.prometheus import PrometheusUnavailable
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import cluster
from autoclusters.sandbox.drivers.demo import DemoError, wait_for
from autoclusters.sandbox.drivers.load import Load
from autoclusters.sandbox.machines import training_job
from autoclusters.sandbox.machines.joblog import progress_lines, went_on_from
from autoclusters.sandbox.runtime.config import SandboxConfig

T = TypeVar("T")

# The demo's loads against one replica's capacity (the stand-in serves `slots` requests of
# `ms_per_request` at a time: 4 x 100 ms = 40 requests/s): calm, then more than one replica
# takes, then calm again. The peak stays within what two replicas serve on a busy 2-core
# machine (about 50 requests/s measured), so the queue drains once the node is lent.
CALM_RPS = 8.0
PEAK_RPS = 45.0


def demo_policy() -> SharePolicy:
    """Fast enough for a demo; the same rules as production."""
    return SharePolicy(
        inference=InferenceTarget(
            demand_query=(
                "histogram_quantile(0.95, sum by (le) "
                "(rate(inference_request_duration_seconds_bucket[10s])))"
            ),
            rate_query="sum(rate(inference_requests_total[10s]))",
            slo=0.5,
        ),
        min_training_nodes=2,
        max_inference_nodes=2,
        min_inference_nodes=1,
        lend_above=1.0,
        return_below=0.5,
        sustain=2,
        cooldown_s=15,
        evaluate_every_s=3,
        checkpoint_grace_s=60,
        ready_timeout_s=120,
    )


class Sample(BaseModel):
    at: float
    slurm: dict[str, list[int]]  # node -> jobs with processes on it
    pods: dict[str, list[str]]  # node -> inference pods on it (not yet gone)


class ShareSummary(BaseModel):
    scenario: str = "share"
    cluster: str
    nodes: list[str]
    job_id: int
    job: str  # torchrun or stand-in
    job_width_before: int
    job_width_during: int | None
    job_width_after: int | None
    max_nodes: int
    lend_s: float | None  # SLO breach seen -> the new replica serving
    return_s: float | None  # demand calm -> the node back in Slurm
    moves: list[dict[str, object]]
    training_restarts: int
    resumed_after_lend: int | None  # the checkpoint step the job resumed from, narrower
    resumed_from_step: int | None  # ... and after regrowing
    slo_s: float
    slo_attainment: float | None  # requests answered within the SLO, over the whole run
    requests: int
    request_errors: int
    request_codes: dict[str, int]  # HTTP status, or the transport error's name, -> requests
    overlap_samples: int  # samples where a node ran a Slurm job and an inference pod at once
    samples: int
    temporal_ui: str
    overlaps: list[Sample] = Field(default_factory=list)


async def on_sandbox(
    cfg: SandboxConfig,
    keep: bool,
    console: Console,
    scenario: Callable[[SandboxConfig, Console], Awaitable[T]],
) -> T:
    """Run a Kubernetes-mode scenario on the sandbox: up (or the one already running),
    then down again unless `keep` or it was running before."""
    was_running = cluster.is_running(cfg) if cfg.record_file.exists() else False
    console.print(f"[bold]1. sandbox[/bold] in {cfg.state_dir} ({cfg.nodes} nodes, Kubernetes)")
    res = await asyncio.to_thread(cluster.up, cfg)
    if res.already_running:
        cfg = SandboxConfig.load(cfg.state_dir)
    try:
        return await scenario(cfg, console)
    finally:
        if not keep and not was_running:
            console.print("[bold]sandbox down[/bold]")
            await asyncio.to_thread(cluster.down, cfg)


async def run_sharing_demo(cfg: SandboxConfig, keep: bool, console: Console) -> ShareSummary:
    return await on_sandbox(cfg, keep, console, _share)


async def _share(cfg: SandboxConfig, console: Console) -> ShareSummary:
    if not cfg.k8s:
        raise DemoError("the share scenario needs the Kubernetes side (--k8s)")
    settings = load_file(cfg.settings_file)
    tc = await temporal.connect(settings)
    slurm = SlurmCli(cfg.slurm_conf)
    assert settings.kubernetes.kubeconfig is not None
    core = k8s_client.CoreV1Api(k8s.api_client(kubeconfig=settings.kubernetes.kubeconfig))
    policy = demo_policy()
    ns = policy.inference.namespace
    nodes = sorted(n.name for n in await slurm.nodes())[: cfg.nodes]
    ui = f"{cfg.temporal_ui_url}/namespaces/default/workflows/gpu-rebalance-{settings.cluster}"

    console.print(f"[bold]2. sharing workflow[/bold] GpuSharing for {settings.cluster}: {ui}")
    await start_sharing(tc, settings.cluster, policy, settings.temporal.task_queue)
    await wait_for("its first look at the nodes", lambda: _known(tc, settings.cluster), 60)
    first = nodes[-1]
    console.print(f"   inference starts on {first}: moved by hand through the same workflow")
    await request_move(
        tc, settings.cluster, MoveRequest(node=first, to="inference", requested_by="demo")
    )
    await wait_for(
        f"{first} to serve inference",
        lambda: _in_pool(tc, settings.cluster, first, Pool.INFERENCE),
        180,
    )

    training = [n for n in nodes if n != first]
    width = len(training)
    job_id, log, kind = await training_job.submit(
        slurm, cfg, "train", (f"--nodes={width - 1}-{width}", "--exclusive")
    )
    console.print(f"[bold]3. training[/bold] job {job_id} ({kind}) on up to {width} nodes")
    job = await wait_for("the job to run at full width", lambda: _width(slurm, job_id, width), 120)
    assert job is not None
    before = len(hostlist.expand(job.nodes))
    await wait_for("the job to step", lambda: _stepping(log, 0), 120)

    sampler = _Sampler(slurm, core, ns)
    sampling = asyncio.create_task(sampler.run())
    load = Load(cfg.inference_gateway_url, rps=CALM_RPS)
    await load.start()
    http = httpx.AsyncClient(timeout=5)  # Prometheus, polled while waiting for the SLO
    try:
        console.print(f"[bold]4. load[/bold] {CALM_RPS:g} requests/s, then {PEAK_RPS:g}")
        await asyncio.sleep(10)  # a calm baseline the SLO holds on (load, not a sync)
        load.set_rps(PEAK_RPS)
        breach_at = await wait_for(
            "the SLO to be breached",
            lambda: _breach(http, cfg, policy, True),
            120,
        )
        console.print("   SLO breached; waiting for the sharing workflow to lend a node")
        lend = await wait_for(
            "a node lent to inference",
            lambda: _move_done(tc, settings.cluster, "inference", after=breach_at),
            300,
        )
        lend_s = _step_end(lend, "wait_serving") - breach_at
        console.print(f"   lent {lend.move.node}: new replica serving {lend_s:.1f}s after breach")
        during = await wait_for(
            "the job to run again, narrower",
            lambda: _running_restarted(slurm, job_id, 1),
            180,
        )
        await asyncio.sleep(20)  # serve the peak on two replicas for a while (load, not a sync)
        load.set_rps(CALM_RPS / 2)
        calm_at = await wait_for("demand to fall", lambda: _breach(http, cfg, policy, False), 120)
        back = await wait_for(
            "the node back in training",
            lambda: _move_done(tc, settings.cluster, "training", after=calm_at),
            300,
        )
        return_s = _step_end(back, "resume_in_slurm") - calm_at
        console.print(f"   returned {back.move.node} {return_s:.1f}s after demand fell")
        after = await wait_for(
            "the job back at full width",
            lambda: _width(slurm, job_id, width),
            240,
        )
        assert after is not None
        await wait_for("the job to step again", lambda: _stepping(log, after.restart_cnt), 180)
    finally:
        stats = await load.stop(drain=False)
        await http.aclose()
        sampler.stop()
        await asyncio.gather(sampling, return_exceptions=True)
    st = await share_status(tc, settings.cluster)
    slo = policy.inference.slo
    within = sum(1 for v in stats.latencies if v <= slo)
    overlaps = [s for s in sampler.samples if set(s.slurm) & set(s.pods)]
    return ShareSummary(
        cluster=settings.cluster,
        nodes=nodes,
        job_id=job_id,
        job=kind,
        job_width_before=before,
        job_width_during=len(hostlist.expand(during.nodes)) if during else None,
        job_width_after=len(hostlist.expand(after.nodes)),
        max_nodes=width,
        lend_s=lend_s,
        return_s=return_s,
        moves=[_move_summary(m) for m in st.moves],
        training_restarts=after.restart_cnt,
        resumed_after_lend=went_on_from(log, 1),
        resumed_from_step=went_on_from(log, after.restart_cnt),
        slo_s=policy.inference.slo,
        slo_attainment=round(within / stats.sent, 4) if stats.sent else None,
        requests=stats.sent,
        request_errors=stats.errors,
        request_codes=dict(stats.codes),
        overlap_samples=len(overlaps),
        samples=len(sampler.samples),
        temporal_ui=ui,
        overlaps=overlaps[:5],
    )


class _Sampler:
    """Both sides of every node, every quarter second."""

    def __init__(self, slurm: SlurmCli, core: k8s_client.CoreV1Api, ns: str) -> None:
        self._slurm, self._core, self._ns = slurm, core, ns
        self.samples: list[Sample] = []
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set():
            jobs, raw = await asyncio.gather(
                self._slurm.jobs(),
                asyncio.to_thread(
                    self._core.list_namespaced_pod,
                    self._ns,
                    label_selector=f"{INFERENCE_APP_LABEL}={INFERENCE_APP}",
                    _preload_content=False,
                ),
            )
            on_slurm: dict[str, list[int]] = {}
            for j in jobs:
                if j.job_state in ("RUNNING", "COMPLETING", "CONFIGURING") and j.nodes:
                    for n in hostlist.expand(j.nodes):
                        on_slurm.setdefault(n, []).append(j.job_id)
            on_k8s: dict[str, list[str]] = {}
            for p in json.loads(getattr(raw, "data", b"") or b"{}").get("items") or []:
                where = (p.get("spec") or {}).get("nodeName")
                if where and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    on_k8s.setdefault(where, []).append(p["metadata"]["name"])
            self.samples.append(Sample(at=time.time(), slurm=on_slurm, pods=on_k8s))
            try:
                await asyncio.wait_for(self._stop.wait(), 0.25)
            except TimeoutError:
                pass


async def _known(tc: Client, cluster_name: str) -> ShareStatus | None:
    st = await share_status(tc, cluster_name)
    return st if st.last_demand is not None else None


async def _in_pool(tc: Client, cluster_name: str, node: str, pool: Pool) -> bool | None:
    st = await share_status(tc, cluster_name)
    return True if st.pools.get(node) == pool and st.current is None else None


async def _width(slurm: SlurmCli, job_id: int, width: int) -> SlurmJob | None:
    job = await slurm.job(job_id)
    if job and job.job_state == "RUNNING" and len(hostlist.expand(job.nodes)) >= width:
        return job
    return None


async def _running_restarted(slurm: SlurmCli, job_id: int, restarts: int) -> SlurmJob | None:
    job = await slurm.job(job_id)
    if job and job.job_state == "RUNNING" and job.restart_cnt >= restarts:
        return job
    return None


async def _stepping(log: Path, restart: int) -> bool | None:
    return True if any(p.restart >= restart for p in progress_lines(log)) else None


async def _breach(
    http: httpx.AsyncClient, cfg: SandboxConfig, policy: SharePolicy, above: bool
) -> float | None:
    try:
        value = await prometheus_value(http, cfg.prometheus_url, policy.inference.demand_query)
    except PrometheusUnavailable:
        # Unknown is not calm (nor a breach): ask again until the wait's deadline. A busy
        # machine (the test suite beside the demo) let one query time out.
        return None
    if value is None:
        return None
    slo = policy.inference.slo
    hit = value > slo * policy.lend_above if above else value < slo * policy.return_below
    return time.time() if hit else None


async def _move_done(tc: Client, cluster_name: str, to: str, after: float) -> MoveRecord | None:
    """The sharing workflow's own move `to` a pool, finished after `after`."""
    st = await share_status(tc, cluster_name)
    own = [m for m in st.moves if m.move.to == to and m.move.requested_by == BY_SHARING]
    for m in own:
        if m.status == "done" and m.finished_at and m.finished_at >= after:
            return m
    failed = [m for m in own if m.status == "failed"]
    if failed and (failed[-1].finished_at or 0) >= after:
        raise DemoError(f"move {failed[-1].move.move_id} failed: {failed[-1].error}")
    return None


def _step_end(rec: MoveRecord, name: str) -> float:
    step = next((s for s in rec.steps if s.name == name), None)
    return (step.finished_at if step and step.finished_at else rec.finished_at) or time.time()


def _move_summary(m: MoveRecord) -> dict[str, object]:
    return {
        "move": m.move.move_id,
        "node": m.move.node,
        "to": m.move.to,
        "status": m.status,
        "by": m.move.requested_by,
        "why": m.move.reason,
        "took_s": round((m.finished_at or m.started_at) - m.started_at, 1),
        "steps": [s.name for s in m.steps],
    }


def print_share_summary(s: ShareSummary, out: Console) -> None:
    def secs(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else "n/a"

    out.print()
    out.print(
        f"[bold]lend[/bold]               {secs(s.lend_s)}  (SLO breach → new replica serving)"
    )
    out.print(
        f"[bold]return[/bold]             {secs(s.return_s)}  (demand calm → node back in Slurm)"
    )
    for m in s.moves:
        out.print(
            f"move               {m['move']}: {m['node']} → {m['to']} "
            f"({m['status']}, {m['took_s']} s, by {m['by']})"
        )
    out.print(
        f"training job       {s.job_id} ({s.job}): width {s.job_width_before} → "
        f"{s.job_width_during} → {s.job_width_after} of {s.max_nodes}; "
        f"{s.training_restarts} restarts, resumed from step {s.resumed_from_step}"
    )
    attained = "n/a" if s.slo_attainment is None else f"{100 * s.slo_attainment:.1f} %"
    out.print(
        f"inference          {s.requests} requests, {attained} within the {s.slo_s:g} s SLO, "
        f"{s.request_errors} errors"
    )
    verdict = "[green]never[/green]" if not s.overlap_samples else f"[red]{s.overlap_samples}[/red]"
    out.print(f"job and pod on one node at once: {verdict} (in {s.samples} samples)")
    out.print(f"Temporal UI        {s.temporal_ui}")
