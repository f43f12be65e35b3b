"""The remediation worker: hosts NodeRemediation, the cluster's FleetGuard and the
activities they call."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from kubernetes.client import ApiClient
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from autoclusters.activities.checkpoint import CheckpointActivities
from autoclusters.activities.cloud import CloudActivities
from autoclusters.activities.cluster_ops import ClusterOpsActivities
from autoclusters.activities.cluster_provider import ClusterProviderActivities
from autoclusters.activities.controller_facts import ControllerActivities
from autoclusters.activities.decisions import DecisionActivities
from autoclusters.activities.guard import GuardActivities
from autoclusters.activities.handoff import HandoffActivities
from autoclusters.activities.health import HealthActivities
from autoclusters.activities.kubernetes import KubernetesActivities
from autoclusters.activities.machine_of import MachineOf
from autoclusters.activities.notify import NotifyActivities
from autoclusters.activities.recovery_history import RecoveryHistoryActivities, TemporalRecoveries
from autoclusters.activities.recovery_loss import RecoveryLossActivities
from autoclusters.activities.screen import ScreenActivities
from autoclusters.activities.sharing_demand import ShareDemandActivities
from autoclusters.activities.sharing_k8s import ShareKubernetesActivities
from autoclusters.activities.sharing_slurm import ShareSlurmActivities
from autoclusters.activities.sharing_yield import ShareYieldActivities
from autoclusters.activities.silences import SilenceActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.settings import Settings
from autoclusters.integrations import k8s, temporal
from autoclusters.integrations.alertmanager import AlertmanagerClient
from autoclusters.integrations.cloud import CloudProvider
from autoclusters.integrations.handoff import HandoffClient
from autoclusters.integrations.health import HealthGate, SlurmHealthGate
from autoclusters.integrations.metrics_http import MetricsServer
from autoclusters.integrations.notify import LogNotifier, Notifier
from autoclusters.integrations.slack.fanout import MultiNotifier
from autoclusters.integrations.slurm import (
    SlurmBatchClient,
    SlurmCli,
    SlurmClient,
    SlurmSignalClient,
)
from autoclusters.integrations.slurm_reservations import SlurmReservationCli
from autoclusters.integrations.tls import default_verify
from autoclusters.workers.build_id import code_build_id
from autoclusters.workers.metrics import WorkerMetrics
from autoclusters.workers.metrics_collector import TemporalCollector
from autoclusters.workers.metrics_interceptor import MetricsInterceptor
from autoclusters.workers.stuck_runs import StuckRunDoctor
from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.gpu_sharing import GpuSharing
from autoclusters.workflows.remediation import NodeRemediation
from autoclusters.workflows.systemic_incident import SystemicIncident

log = logging.getLogger("autoclusters.worker")

# Where provider crusoe-cmk puts a cluster's Slinky objects on the CMK cluster.
CMK_NAMESPACE = "slurm"

# ClusterProvisioning's provider activities (`cluster_*`, activities/cluster_provider.py) are
# registered when Crusoe credentials are configured (on the sandbox they point at the
# emulator); without them, a provisioning started here waits at its first step.
WORKFLOWS = [
    NodeRemediation,
    FleetGuard,
    ClusterProvisioning,
    ScaleNodeSet,
    ClusterTeardown,
    GpuSharing,
    SystemicIncident,
]


def cloud_provider(settings: Settings) -> CloudProvider:
    if settings.cloud_provider == "crusoe":
        from autoclusters.integrations.crusoe import CrusoeClient, CrusoeCloud, load_credentials

        creds = load_credentials(
            profile=settings.crusoe.profile, config_path=settings.crusoe.config_file
        )
        client = CrusoeClient(
            credentials=creds, project_id=settings.crusoe.project_id, poll_s=settings.crusoe.poll_s
        )
        return CrusoeCloud(
            client,
            cluster_id=settings.crusoe.cluster_id,
            node_pool_ids=settings.crusoe.node_pool_ids,
            replace_timeout_s=settings.crusoe.replace_timeout_s,
        )
    raise ValueError(f"unknown cloud provider {settings.cloud_provider!r}")


def cluster_provider(
    settings: Settings, slurm: SlurmBatchClient
) -> ClusterProviderActivities | None:
    """Providers sandbox and crusoe-managed-slurm on the Crusoe API the credentials name,
    and crusoe-cmk when a kubeconfig and a CMK cluster id are configured too (else it
    refuses); None without credentials."""
    from autoclusters.integrations.crusoe import CredentialsError, CrusoeClient, load_credentials

    try:
        creds = load_credentials(
            profile=settings.crusoe.profile, config_path=settings.crusoe.config_file
        )
        client = CrusoeClient(
            credentials=creds, project_id=settings.crusoe.project_id, poll_s=settings.crusoe.poll_s
        )
    except (CredentialsError, ValueError) as e:
        log.warning("cluster provider activities not registered: %s", e)
        return None
    cmk = None
    if settings.kubernetes.kubeconfig is not None and settings.crusoe.cluster_id:
        from autoclusters.activities.cluster_providers.cmk import CmkProvider
        from autoclusters.integrations.slinky_crs import KubeObjects

        kube = KubeObjects(k8s.api_client(kubeconfig=settings.kubernetes.kubeconfig), CMK_NAMESPACE)
        cmk = CmkProvider(
            client,
            kube,
            slurm,
            cmk_cluster_id=settings.crusoe.cluster_id,
            poll_s=settings.crusoe.poll_s,
        )
    return ClusterProviderActivities(client, slurm, poll_s=settings.crusoe.poll_s, cmk=cmk)


def health_gate(settings: Settings, slurm: SlurmClient) -> HealthGate:
    # Slurm's side; the hardware's is the node agent's evidence, judged in the workflow.
    return SlurmHealthGate(slurm, expected_gpus=settings.health.expected_gpus)


def notifiers_for(settings: Settings, metrics: WorkerMetrics | None = None) -> list[Notifier]:
    """The log always; Slack when configured. Sent side by side, so a Slack outage
    neither blocks nor fails a remediation (each notifier is bounded in time). With
    `metrics`, Slack's deliveries are counted."""
    chosen: list[Notifier] = [LogNotifier()]
    if settings.slack is not None:
        from autoclusters.integrations.slack import SlackNotifier

        cfg = settings.slack.model_copy(
            update={
                "temporal_ui_url": settings.slack.temporal_ui_url or settings.temporal.ui_url,
                "api_url": settings.slack.api_url or settings.api_public_url,
            }
        )
        on_delivery = metrics.slack_delivery if metrics is not None else None
        chosen.append(SlackNotifier.from_config(cfg, on_delivery=on_delivery))
    return [MultiNotifier(chosen, timeout_s=20)]


def activities_for(
    slurm: SlurmClient,
    cloud: CloudProvider,
    health: HealthGate,
    guard: GuardActivities,
    notifiers: list[Notifier] | None = None,
    kubernetes: KubernetesActivities | None = None,
    silences: SilenceActivities | None = None,
    machines: MachineOf | None = None,
    approval_keys: Sequence[str] = (),
) -> list[Any]:
    """`machines`: a Slurm node's Node and VM (None: the VM of its name, no Kubernetes).
    `approval_keys`: what checks the proof of a person's decision (none: every decision is
    refused)."""
    s, h = SlurmActivities(slurm), HealthActivities(health)
    c = CloudActivities(cloud, machines=machines)
    n = NotifyActivities(notifiers if notifiers is not None else [LogNotifier()])
    k8s = (
        [
            kubernetes.cordon_node,
            kubernetes.uncordon_node,
            kubernetes.evict_pods,
            kubernetes.wait_new_node_ready,
            kubernetes.set_node_condition,
            kubernetes.node_identity,
            kubernetes.find_slurmd_pod,
        ]
        if kubernetes is not None
        else []
    )
    # Checkpoint-aware quarantine signals jobs: served with a client that can (the real one
    # can; the scale benchmark's stand-in cannot, and its incidents use no such policy).
    checkpoint = (
        [CheckpointActivities(slurm).checkpoint_jobs]
        if isinstance(slurm, SlurmSignalClient)
        else []
    )
    # Without an Alertmanager the steps answer "not silenced" (a run may still ask).
    quiet = silences or SilenceActivities(None, node_label="Hostname", max_s=3600)
    return [
        *k8s,
        *checkpoint,
        quiet.silence_node_alerts,
        quiet.lift_silence,
        s.drain_node,
        s.requeue_jobs,
        s.wait_node_idle,
        s.wait_node_registered,
        s.return_to_service,
        s.take_spare,
        s.park_as_spare,
        s.verify_quarantine,
        s.cancel_jobs,
        RecoveryLossActivities(slurm).measure_recovery,
        guard.claim_spare,
        guard.refill_spare,
        c.plan_repair,
        c.repair_node,
        c.replace_node,
        h.health_gate,
        guard.register,
        guard.admit_quarantine,
        guard.admit_repair,
        guard.admit_held_drain,
        guard.release,
        guard.slurm_view,
        guard.attach_policy,
        *guard.systemic().activities(),
        n.notify,
        DecisionActivities(approval_keys).check_decision_proof,
        ControllerActivities(slurm).controller_facts,
    ]


def sharing_activities(
    client: Client, settings: Settings, slurm: SlurmClient, kube_api: ApiClient | None
) -> list[Any]:
    """GpuSharing's steps. Its Kubernetes steps need a kubeconfig and its Slurm steps a
    client that can signal jobs (the real one can; the scale benchmark's stand-in cannot);
    without them only the incident's side (`share_yield_node`) is served, and a sharing workflow's
    moves wait for a worker that has them."""
    out: list[Any] = [ShareYieldActivities(client).yield_node]
    if not isinstance(slurm, SlurmSignalClient):
        return out
    demand = ShareDemandActivities(
        slurm,
        httpx.AsyncClient(timeout=10, verify=default_verify()),
        prometheus_url=settings.monitoring.prometheus_url,
        kube=kube_api,
    )
    share_slurm = ShareSlurmActivities(slurm)
    out += [
        demand.read_demand,
        share_slurm.drain_for_move,
        share_slurm.checkpoint_jobs,
        share_slurm.mark_lent,
        share_slurm.resume_training,
        share_slurm.regrow_jobs,
    ]
    if kube_api is not None:
        share_k8s = ShareKubernetesActivities(kube_api, request_timeout_s=10)
        out += [
            share_k8s.lend,
            share_k8s.scale_inference,
            share_k8s.wait_serving,
            share_k8s.release,
            share_k8s.reclaim,
        ]
    return out


def screen_activities(settings: Settings, slurm: SlurmClient) -> list[Any]:
    """The burn-in screen (policy burn_in): served with the real Slurm commands only (the
    scale benchmark's stand-in has no reservations). In the sandbox the screen's files live
    in its state dir and the diagnostic reads the agents' fake-backend files there; on a real
    cluster `[health] screen_dir` is one every node sees (the job's output and FileStore), and each
    node runs one rank per GPU (`[health] expected_gpus`)."""
    if not isinstance(slurm, SlurmCli):
        return []
    state = settings.sandbox.state_dir
    work = settings.health.screen_dir or (state or Path.home() / ".autoclusters") / "screens"
    screen = ScreenActivities(
        SlurmReservationCli(settings.slurm.conf, settings.slurm.bin_dir),
        work,
        fake_dir=state / "agent" if state is not None else None,
        # The sandbox's GPUs are files: one rank (two alone) spares its CPUs.
        ranks_per_node=None if state is not None else settings.health.expected_gpus,
        python=settings.health.screen_python or sys.executable,
    )
    return [screen.burn_in_screen]


def handoff_activities(settings: Settings) -> HandoffActivities:
    """The hand-off's webhook, signed with the settings' secret (none: every send fails
    at once, saying so; the incident is left drained for a human)."""
    secret = settings.handoff.secret
    client = (
        HandoffClient(
            httpx.AsyncClient(timeout=20, verify=default_verify()), secret.get_secret_value()
        )
        if secret is not None
        else None
    )
    return HandoffActivities(client, settings.api_public_url)


def build_worker(
    client: Client,
    settings: Settings,
    slurm: SlurmClient,
    cloud: CloudProvider,
    health: HealthGate,
    provider: ClusterProviderActivities | None = None,
    metrics: WorkerMetrics | None = None,
) -> Worker:
    """With `metrics`, every activity is measured (workers/metrics_interceptor.py)."""
    guard = GuardActivities(client, slurm, settings.temporal.task_queue)
    ops = ClusterOpsActivities(client, slurm)
    notifiers = notifiers_for(settings, metrics)
    kube_api = (
        k8s.api_client(kubeconfig=settings.kubernetes.kubeconfig)
        if settings.kubernetes.kubeconfig
        else None
    )
    # One reading of which Node and VM a Slurm node is, for the Kubernetes and cloud steps.
    machines = MachineOf(kube_api, namespace=CMK_NAMESPACE, request_timeout_s=10)
    kubernetes = (
        KubernetesActivities(kube_api, request_timeout_s=10, machines=machines)
        if kube_api is not None
        else None
    )
    silences = SilenceActivities(
        AlertmanagerClient(settings.monitoring.alertmanager_url)
        if settings.monitoring.alertmanager_url
        else None,
        node_label=settings.monitoring.alert_node_label,
        max_s=settings.monitoring.silence_max_s,
    )
    return Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=[
            *activities_for(
                slurm,
                cloud,
                health,
                guard,
                notifiers,
                kubernetes=kubernetes,
                silences=silences,
                machines=machines,
                approval_keys=[k.get_secret_value() for k in settings.approval.keys],
            ),
            ops.node_load,
            ops.incident_open,
            ops.workflow_running,
            # The recovery plan's figures from the cluster's measured history (its closed
            # incidents, read from this Temporal).
            RecoveryHistoryActivities(TemporalRecoveries(client).recent).recovery_figures,
            *(provider.activities() if provider is not None else []),
            *sharing_activities(client, settings, slurm, kube_api),
            *screen_activities(settings, slurm),
            handoff_activities(settings).send_handoff,
        ],
        graceful_shutdown_timeout=timedelta(seconds=5),
        # Ours, not the SDK's default (workers/build_id.py: a tenth of the start's CPU).
        build_id=code_build_id(),
        interceptors=[MetricsInterceptor(metrics, client)] if metrics is not None else [],
    )


async def run(
    settings: Settings,
    *,
    slurm: SlurmBatchClient | None = None,
    cloud: CloudProvider | None = None,
) -> None:
    """`slurm`, `cloud`: other clients than the configured ones (the scale benchmark's
    stand-in cluster, bench/scale_worker.py); everything else is as configured."""
    client = await temporal.connect(settings)
    slurm = slurm or SlurmCli(settings.slurm.conf, settings.slurm.bin_dir)
    metrics = WorkerMetrics() if settings.worker.metrics_port is not None else None
    worker = build_worker(
        client,
        settings,
        slurm,
        cloud or cloud_provider(settings),
        health_gate(settings, slurm),
        cluster_provider(settings, slurm),
        metrics,
    )
    server = serve_metrics(
        client,
        metrics,
        settings.worker.metrics_port,
        settings.worker.metrics_host,
        settings.worker.metrics_token,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker polling %s on %s", settings.temporal.task_queue, settings.temporal.address)
    watch: asyncio.Task[None] | None = None
    if settings.worker.stuck_run_check_s > 0:
        doctor = StuckRunDoctor(
            client,
            settings.temporal.task_queue,
            WORKFLOWS,
            on_outcome=metrics.stuck_run if metrics is not None else None,
        )
        watch = asyncio.create_task(doctor.watch(settings.worker.stuck_run_check_s, stop))
    try:
        async with worker:
            await stop.wait()
    finally:
        if watch is not None:
            watch.cancel()
        if server is not None:
            server.stop()
    log.info("worker stopped")


def serve_metrics(
    client: Client,
    metrics: WorkerMetrics | None,
    port: int | None,
    host: str = "127.0.0.1",
    token: SecretStr | None = None,
) -> MetricsServer | None:
    """The worker's metrics, with what Temporal knows now, on `host:port` (loopback unless
    settings say otherwise; a token required off loopback); call on the worker's event loop
    (the collector reads Temporal through it)."""
    if metrics is None or port is None:
        return None
    metrics.registry.register(TemporalCollector(client))
    server = MetricsServer(metrics.registry, host, port, token)
    log.info("worker metrics on %s", server.url)
    return server
