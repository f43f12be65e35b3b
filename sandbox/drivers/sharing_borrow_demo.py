"""`autoclusters demo --scenario borrow`: a training job loses a node, no spare is free, and
GPU sharing lends it an inference node for the repair's duration.

The sandbox comes up in Kubernetes mode with 4 nodes; the sharing workflow starts with
`borrow_from_inference` on; two nodes are moved to inference by hand (the initial split);
a 2-node training job (`--nodes=2`: it runs at its width or not at all) runs on the other
two, and inference serves a steady load throughout. Then an Xid on one of the job's nodes:
the incident drains it and requeues the job, which cannot start on one node. The
sharing workflow sees a training node lost to an incident, no spare, inference with room to
spare: it lends the inference node serving least (off inference, gated, resumed in Slurm)
and the job starts on it at full width from its checkpoint. The GPU stays broken until a
replacement (the reboot fails its gate, the incident escalates, a new VM boots), then the
incident returns the node to service; at its next evaluation the sharing workflow gives the node
back (the job checkpoints and requeues onto the repaired node, the replica serves again).

Throughout, every node is sampled (a Slurm job and an inference pod never on one node),
and every inference request is counted: none may fail.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client as k8s_client
from pydantic import BaseModel, Field
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError

from autoclusters.clients.sharing import request_move, share_status, start_sharing
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState, SlurmJob
from autoclusters.core.policy import Rung
from autoclusters.core.settings import load_file
from autoclusters.core.sharing import Borrow, MoveRequest, Pool, SharePolicy
from autoclusters.integrations import k8s, temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.cluster import sandbox_policy
from autoclusters.sandbox.drivers.demo import DemoError, incident_since, wait_for
from autoclusters.sandbox.drivers.load import Load
from autoclusters.sandbox.drivers.sharing_demo import (
    CALM_RPS,
    Sample,
    _in_pool,
    _known,
    _move_summary,
    _Sampler,
    _stepping,
    _width,
    demo_policy,
    on_sandbox,
)
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines import training_job
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.machines.joblog import progress_lines
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation

FAULT = "XID_79"
# The GPU is broken until a replacement: the reboot fails its gate and the incident
# escalates, a repair that outlasts the borrow (two boot delays and their gates), as the
# repairs worth borrowing for do.
FIXED_BY = Rung("replace")
WIDTH = 2
RDZV_OFFSET = 98  # a port of the sandbox's span no daemon of it takes (sandbox/runtime/config.py)


def borrow_policy() -> SharePolicy:
    """The share demo's, with borrowing on; no lend or return on demand (the load is
    steady: this scenario is about the borrow alone)."""
    return demo_policy().model_copy(
        update={
            "borrow_from_inference": True,
            "borrow_headroom": 0.3,  # inference's p95 at most 0.35 s of its 0.5 s SLO
            "return_below": 0.01,  # never calm enough to return a node on demand
            "min_training_nodes": 1,
            "min_inference_nodes": 1,
            "max_inference_nodes": 2,
        }
    )


class BorrowSummary(BaseModel):
    scenario: str = "borrow"
    cluster: str
    nodes: list[str]
    job_id: int
    job: str  # torchrun or stand-in
    fault: str
    fault_node: str
    incident_id: str
    incident_status: str
    borrowed_node: str | None
    borrow_status: str | None
    borrow_why: str
    # Seconds from the fault: the borrowed node back in Slurm for the job, the repaired
    # node back in service, the borrowed node serving inference again.
    lent_at_s: float | None
    repaired_at_s: float | None
    returned_at_s: float | None
    # The runbook began returning the repaired node -> the give-back starts. From the
    # return's start: the node is back in Slurm within it (resumed, then read until it
    # answers a ping), so the sharing workflow may see it before the step ends (ci31: the
    # give-back began 0.15 s before the step's recorded end).
    give_back_after_repair_s: float | None
    evaluate_every_s: float
    job_width_before: int
    job_width_during: int | None
    job_width_after: int | None
    job_nodes_during: list[str]
    job_nodes_after: list[str]
    training_restarts: int
    # Steps the job logged on the borrowed node, and the steps it did twice after the
    # give-back (its last step before it against the checkpoint it resumed from).
    steps_on_borrowed_node: int
    steps_redone_at_give_back: int | None
    moves: list[dict[str, object]]
    requests: int
    request_errors: int
    request_codes: dict[str, int]
    overlap_samples: int
    samples: int
    temporal_ui: str
    overlaps: list[Sample] = Field(default_factory=list)


async def run_sharing_borrow_demo(
    cfg: SandboxConfig, keep: bool, console: Console
) -> BorrowSummary:
    return await on_sandbox(cfg, keep, console, _borrow)


def _requeue_policy(cfg: SandboxConfig) -> str:
    """The sandbox's policy with the requeue path: the job leaves the faulty node and
    waits for its width, which is what a borrow gives it."""
    doc = yaml.safe_load(sandbox_policy(cfg, mode="auto"))
    doc["job_recovery"] = "requeue"
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class BorrowRig:
    """The scenario's set-up, ready for a fault: the sharing workflow with borrowing on, two nodes
    serving inference, the 2-node job stepping on the other two (bench/mttr.py's borrowed
    path faults it again and again)."""

    tc: Client
    slurm: SlurmCli
    core: k8s_client.CoreV1Api
    policy: SharePolicy
    nodes: list[str]
    name: str  # the cluster's
    ui: str  # the sharing workflow in the Temporal UI
    job_id: int
    log: Path
    kind: str  # torchrun or stand-in
    before: list[str]  # the job's nodes


async def set_up_borrow(cfg: SandboxConfig, console: Console) -> BorrowRig:
    if not cfg.k8s:
        raise DemoError("the borrow scenario needs the Kubernetes side (--k8s)")
    if cfg.nodes < 4:
        raise DemoError("the borrow scenario needs 4 nodes: 2 training, 2 inference")
    settings = load_file(cfg.settings_file)
    tc = await temporal.connect(settings)
    slurm = SlurmCli(cfg.slurm_conf)
    assert settings.kubernetes.kubeconfig is not None
    core = k8s_client.CoreV1Api(k8s.api_client(kubeconfig=settings.kubernetes.kubeconfig))
    policy = borrow_policy()
    nodes = sorted(n.name for n in await slurm.nodes())[: cfg.nodes]
    name = settings.cluster
    ui = f"{cfg.temporal_ui_url}/namespaces/default/workflows/gpu-rebalance-{name}"
    cfg.policy_file.write_text(_requeue_policy(cfg))

    console.print(f"[bold]2. sharing workflow[/bold] GpuSharing, borrow_from_inference on: {ui}")
    await start_sharing(tc, name, policy, settings.temporal.task_queue)
    await wait_for("its first look at the nodes", lambda: _known(tc, name), 60)
    serving = nodes[-2:]
    for node in serving:
        await request_move(tc, name, MoveRequest(node=node, to="inference", requested_by="demo"))
        await wait_for(f"{node} to serve inference", _serving(tc, name, node), 180)
    console.print(f"   inference serves on {', '.join(serving)} (moved by hand)")

    # The job's rendezvous port from this sandbox's own span (sbatch exports the demo's
    # environment): train.sbatch's default, 29500 + job id, is every sandbox's job 2 on this
    # machine, and a second sandbox's job broke this one's c10d store in a run beside it.
    saved = os.environ.get("RDZV_PORT")
    os.environ["RDZV_PORT"] = str(cfg.port_base + RDZV_OFFSET)
    try:
        job_id, log, kind = await training_job.submit(
            slurm, cfg, "train", (f"--nodes={WIDTH}", "--exclusive")
        )
    finally:
        if saved is None:
            os.environ.pop("RDZV_PORT", None)
        else:
            os.environ["RDZV_PORT"] = saved
    console.print(f"[bold]3. training[/bold] job {job_id} ({kind}), {WIDTH} nodes wide")
    job = await wait_for("the job to run", lambda: _width(slurm, job_id, WIDTH), 180)
    before = hostlist.expand(job.nodes)
    await wait_for("the job to step", lambda: _stepping(log, 0), 180)
    return BorrowRig(
        tc=tc, slurm=slurm, core=core, policy=policy, nodes=nodes, name=name, ui=ui,
        job_id=job_id, log=log, kind=kind, before=before,
    )  # fmt: skip


async def _borrow(cfg: SandboxConfig, console: Console) -> BorrowSummary:
    rig = await set_up_borrow(cfg, console)
    tc, slurm, core, policy, nodes, name = (
        rig.tc, rig.slurm, rig.core, rig.policy, rig.nodes, rig.name,
    )  # fmt: skip
    ns, ui, job_id, log, kind, before = (
        policy.inference.namespace, rig.ui, rig.job_id, rig.log, rig.kind, rig.before,
    )  # fmt: skip

    sampler = _Sampler(slurm, core, ns)
    sampling = asyncio.create_task(sampler.run())
    load = Load(cfg.inference_gateway_url, rps=CALM_RPS)
    await load.start()
    try:
        console.print(f"[bold]4. load[/bold] {CALM_RPS:g} requests/s on inference throughout")
        await asyncio.sleep(5)  # a baseline the SLO holds on (load, not a sync)
        node = before[-1]
        vm = machine_names.vm_of(cfg, node)
        if vm is None:
            raise DemoError(f"no machine for {node}")
        console.print(f"[bold]5. fault[/bold] {FAULT} on {node}, no spare free")
        fault_at = time.time()
        Hardware(cfg.state_dir).inject(
            node, vm.vm_id, HardwareFault(fault=FAULT, fixed_by=FIXED_BY)
        )
        opened = await wait_for(
            "the fault to open an incident", lambda: incident_since(tc, name, node, fault_at), 60
        )
        console.print(f"   incident {opened.incident_id}")
        lent = await _explained(
            tc, name, "an inference node lent to the job", _borrow_in(tc, name, LENT), 240
        )
        console.print(f"   borrowed {lent.node} from inference: {lent.why}")
        during = await wait_for(
            "the job at full width on the borrowed node",
            lambda: _on(slurm, job_id, lent.node, True),
            240,
        )
        console.print(f"   job {job_id} on {during.nodes}")
        handle = tc.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        try:
            final: IncidentState = await asyncio.wait_for(handle.result(), 300)
            status = final.status
        except WorkflowFailureError as e:
            raise DemoError(f"incident {opened.incident_id} failed: {e.cause}") from None
        back = final.step("return_to_service")
        repaired_at = back.finished_at.timestamp() if back and back.finished_at else None
        returning_at = back.started_at.timestamp() if back and back.finished_at else None
        console.print(f"   incident {status}: {node} back in service")
        gone = await _explained(
            tc, name, "the borrowed node back in inference", _borrow_in(tc, name, {"returned"}), 240
        )
        console.print(f"   {gone.node} serves inference again")
        after = await wait_for(
            "the job at full width off the borrowed node",
            lambda: _on(slurm, job_id, lent.node, False),
            240,
        )
        await wait_for("the job to step again", lambda: _stepping(log, after.restart_cnt), 240)
    finally:
        stats = await load.stop(drain=True)
        sampler.stop()
        await asyncio.gather(sampling, return_exceptions=True)
    st = await share_status(tc, name)
    give_back = next((m for m in st.moves if m.move.move_id == gone.give_back_move), None)
    overlaps = [s for s in sampler.samples if set(s.slurm) & set(s.pods)]
    lines = progress_lines(log)
    on_borrowed = {p.step for p in lines if p.node == gone.node and p.restart == during.restart_cnt}
    resumed = next(
        (p.resumed_from for p in lines if p.restart == after.restart_cnt and p.resumed_from),
        None,
    )
    redone = max(on_borrowed) - resumed if on_borrowed and resumed is not None else None

    def since(t: float | None) -> float | None:
        return round(t - fault_at, 2) if t is not None else None

    return BorrowSummary(
        cluster=name,
        nodes=nodes,
        job_id=job_id,
        job=kind,
        fault=FAULT,
        fault_node=node,
        incident_id=opened.incident_id,
        incident_status=status,
        borrowed_node=gone.node,
        borrow_status=gone.status,
        borrow_why=gone.why,
        lent_at_s=since(gone.lent_at),
        repaired_at_s=since(repaired_at),
        returned_at_s=since(gone.returned_at),
        give_back_after_repair_s=(
            round(give_back.started_at - returning_at, 2) if give_back and returning_at else None
        ),
        evaluate_every_s=policy.evaluate_every_s,
        job_width_before=len(before),
        job_width_during=len(hostlist.expand(during.nodes)),
        job_width_after=len(hostlist.expand(after.nodes)),
        job_nodes_during=hostlist.expand(during.nodes),
        job_nodes_after=hostlist.expand(after.nodes),
        training_restarts=after.restart_cnt,
        steps_on_borrowed_node=len(on_borrowed),
        steps_redone_at_give_back=redone,
        moves=[_move_summary(m) for m in st.moves],
        requests=stats.sent,
        request_errors=stats.errors,
        request_codes=dict(stats.codes),
        overlap_samples=len(overlaps),
        samples=len(sampler.samples),
        temporal_ui=ui,
        overlaps=overlaps[:5],
    )


def _serving(tc: Client, cluster_name: str, node: str) -> Callable[[], Awaitable[bool | None]]:
    return lambda: _in_pool(tc, cluster_name, node, Pool.INFERENCE)


LENT = {"lent", "giving_back", "returned"}  # lent, whatever has happened since


def _borrow_in(
    tc: Client, cluster_name: str, statuses: set[str], incident_id: str | None = None
) -> Callable[[], Awaitable[Borrow | None]]:
    """The borrow (for `incident_id`'s repair, else any) once in one of `statuses`."""

    async def check() -> Borrow | None:
        st = await share_status(tc, cluster_name)
        for b in st.borrows:
            if incident_id is not None and b.incident_id != incident_id:
                continue  # an earlier fault's (the bench faults one sandbox again and again)
            if b.status in statuses:
                return b
            if b.status in ("failed", "taken"):
                raise DemoError(f"the borrow of {b.node} ended {b.status}: {b.ended_why}")
        return None

    return check


async def _explained(
    tc: Client,
    cluster_name: str,
    what: str,
    check: Callable[[], Awaitable[Borrow | None]],
    timeout_s: float,
) -> Borrow:
    """Wait; a timeout says why the sharing workflow did not borrow (its last verdict)."""
    try:
        return await wait_for(what, check, timeout_s)
    except DemoError as e:
        st = await share_status(tc, cluster_name)
        raise DemoError(
            f"{e}; the sharing workflow: {st.last_borrow_verdict or 'no verdict'}"
        ) from None


async def _on(slurm: SlurmCli, job_id: int, node: str, there: bool) -> SlurmJob | None:
    """The job running at full width, with (or without) `node` among its nodes."""
    job = await _width(slurm, job_id, WIDTH)
    if job is None or (node in hostlist.expand(job.nodes)) != there:
        return None
    return job


def main(as_json: bool, keep: bool, state_dir: Path, port_base: int, boot_delay: float) -> int:
    """`autoclusters demo --scenario borrow`: the summary, and one JSON line with --json."""
    err = Console(stderr=True)
    cfg = SandboxConfig(
        state_dir=state_dir.absolute(), port_base=port_base, boot_delay_s=boot_delay, k8s=True
    )
    out = err if as_json else Console()
    try:
        summary = asyncio.run(run_sharing_borrow_demo(cfg, keep=keep, console=out))
    except DemoError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        return 1
    print_borrow_summary(summary, out)
    if as_json:
        print(summary.model_dump_json())
    return 0


def print_borrow_summary(s: BorrowSummary, out: Console) -> None:
    def secs(v: float | None) -> str:
        return f"+{v:.1f} s" if v is not None else "n/a"

    out.print()
    out.print(
        f"[bold]fault[/bold]              {s.fault} on {s.fault_node}: "
        f"incident {s.incident_id} ({s.incident_status})"
    )
    out.print(
        f"[bold]borrowed[/bold]           {s.borrowed_node} ({s.borrow_status}): {s.borrow_why}"
    )
    out.print(f"lent to training   {secs(s.lent_at_s)} after the fault")
    out.print(f"repaired           {secs(s.repaired_at_s)} ({s.fault_node} back in service)")
    gap = "n/a" if s.give_back_after_repair_s is None else f"{s.give_back_after_repair_s:.1f} s"
    out.print(
        f"given back         {secs(s.returned_at_s)} (started {gap} after the return began; "
        f"evaluations every {s.evaluate_every_s:g} s)"
    )
    for m in s.moves:
        out.print(
            f"move               {m['move']}: {m['node']} → {m['to']} "
            f"({m['status']}, {m['took_s']} s, by {m['by']})"
        )
    during, after = ", ".join(s.job_nodes_during), ", ".join(s.job_nodes_after)
    out.print(
        f"training job       {s.job_id} ({s.job}): width {s.job_width_before} → "
        f"{s.job_width_during} ({during}) → {s.job_width_after} ({after}); "
        f"{s.training_restarts} restarts"
    )
    out.print(
        f"                   {s.steps_on_borrowed_node} steps on {s.borrowed_node}; "
        f"{s.steps_redone_at_give_back} done again after the give-back"
    )
    failed = s.request_errors
    errors = f"[green]{failed}[/green]" if not failed else f"[red]{failed}[/red]"
    out.print(f"inference          {s.requests} requests, {errors} failed")
    verdict = "[green]never[/green]" if not s.overlap_samples else f"[red]{s.overlap_samples}[/red]"
    out.print(f"job and pod on one node at once: {verdict} (in {s.samples} samples)")
    out.print(f"Temporal UI        {s.temporal_ui}")
