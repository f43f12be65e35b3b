"""The worker's metrics, on a Temporal dev server (visibility is real) with the fake fleet.

Aspects covered:
- the activity interceptor times each activity in a real Worker, by type and outcome (a
  failed attempt, then the retry that succeeds);
- a whole incident: every runbook step timed, the fleet guard's admissions counted, the
  incident counted closed with its job and capacity recovery observed once;
- the collector counts open incidents from visibility by status, fault and rung, and
  reads the fleet guard (queue, breaker, counts); Temporal unreachable: marked down;
- the HTTP endpoint serves the text format on loopback, the collector's gauges included;
- the Slack notifier reports each delivery's outcome (sent, duplicate, slack_error);
- job and capacity recovery read off a timeline (spare or repair, nothing when not due).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.activities.guard import GuardActivities
from autoclusters.core.guard import guard_workflow_id
from autoclusters.core.models import (
    IncidentRequest,
    IncidentState,
    Notification,
    StepRecord,
    workflow_id,
)
from autoclusters.core.policy import FaultRule, GuardPolicy, Policy, Rung, StepPolicy
from autoclusters.core.recovery import capacity_recovery, job_recovery
from autoclusters.integrations import temporal
from autoclusters.integrations.slack import SlackNotifier, slack_web_client
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.slack.emulator import EmulatorConfig, create_app
from autoclusters.workers.metrics import WorkerMetrics
from autoclusters.workers.metrics_collector import TemporalCollector
from autoclusters.workers.metrics_interceptor import MetricsInterceptor
from autoclusters.workers.remediation import WORKFLOWS, activities_for, serve_metrics
from autoclusters.workflows.remediation import NodeRemediation
from tests.fakes.systems import FakeCloud, FakeHealth, FakeSlurm, RecordingNotifier
from tests.helpers import dev_server_env, eventually

pytestmark = pytest.mark.integration  # a Temporal dev server

STEPS = {r: StepPolicy(idle_timeout_s=0.5) for r in (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE)}


def _policy(**changes: Any) -> Policy:
    fields: dict[str, Any] = {
        "approvers": ["alice"],
        "approval_timeout_s": 3600,
        "faults": {"XID_79": FaultRule(severity="critical", first_rung=Rung.REBOOT)},
        "steps": STEPS,
        # 4 nodes: one out leaves 0.75 in service, a second would leave 0.5 (held).
        "guard": GuardPolicy(min_in_service_fraction=0.7, breaker_threshold=10),
    }
    return Policy(**{**fields, **changes})


env = dev_server_env  # a Temporal dev server for the module


def samples(metrics: WorkerMetrics | bytes) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the text format: (name, labels) -> value."""
    text = metrics if isinstance(metrics, bytes) else metrics.render()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


def value(metrics: WorkerMetrics | bytes, name: str, **labels: str) -> float:
    return samples(metrics).get((name, frozenset(labels.items())), 0.0)


# --- the interceptor on a tiny workflow -----------------------------------------------------

ATTEMPTS: dict[str, int] = {}


@activity.defn(name="flaky_step")
async def flaky_step(key: str) -> str:
    ATTEMPTS[key] = ATTEMPTS.get(key, 0) + 1
    if ATTEMPTS[key] == 1:
        raise RuntimeError("first attempt fails")
    return "done"


@workflow.defn(sandboxed=False)
class OneFlakyStep:
    @workflow.run
    async def run(self, key: str) -> str:
        return await workflow.execute_activity(
            flaky_step,
            key,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
        )


async def test_the_interceptor_times_each_attempt_by_outcome(env: WorkflowEnvironment) -> None:
    metrics, queue, key = WorkerMetrics(), f"tq-{uuid.uuid4()}", uuid.uuid4().hex
    async with Worker(
        env.client,
        task_queue=queue,
        workflows=[OneFlakyStep],
        activities=[flaky_step],
        interceptors=[MetricsInterceptor(metrics, env.client)],
    ):
        result = await env.client.execute_workflow(
            OneFlakyStep.run, key, id=f"wf-{key}", task_queue=queue
        )
    assert result == "done"
    name = "autoclusters_worker_step_duration_seconds_count"
    assert value(metrics, name, activity="flaky_step", outcome="failed") == 1
    assert value(metrics, name, activity="flaky_step", outcome="ok") == 1
    assert value(metrics, "autoclusters_worker_step_duration_seconds_sum",
                 activity="flaky_step", outcome="ok") > 0  # fmt: skip


# --- a whole incident on the fake fleet ---------------------------------------------------


@dataclass
class Fleet:
    client: Client
    cluster: str
    task_queue: str
    slurm: FakeSlurm
    cloud: FakeCloud
    metrics: WorkerMetrics

    async def open(self, node: str, *, policy: Policy) -> Any:
        """Start an incident with the search attributes the API gives it."""
        req = IncidentRequest(
            incident_id=f"INC-{uuid.uuid4().hex[:8]}",
            cluster=self.cluster,
            node=node,
            fault="XID_79",
            opened_at=datetime.now(UTC),
            policy=policy,
        )
        return await self.client.start_workflow(
            NodeRemediation.run,
            req,
            id=workflow_id(req.cluster, node),
            task_queue=self.task_queue,
            execution_timeout=timedelta(minutes=10),
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(temporal.INCIDENT_ID, req.incident_id),
                    SearchAttributePair(temporal.CLUSTER, req.cluster),
                    SearchAttributePair(temporal.NODE, node),
                    SearchAttributePair(temporal.FAULT, req.fault),
                    SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
                ]
            ),
        )


@asynccontextmanager
async def fleet(env: WorkflowEnvironment) -> AsyncIterator[Fleet]:
    slurm = FakeSlurm()
    for i in range(1, 5):
        slurm.add_node(f"gpu-{i:02d}")
    slurm.add_job(101, nodes="gpu-[01,03]")
    cloud = FakeCloud(slurm)
    f = Fleet(
        env.client, f"m-{uuid.uuid4().hex[:8]}", f"tq-{uuid.uuid4()}", slurm, cloud, WorkerMetrics()
    )
    guard = GuardActivities(env.client, slurm, f.task_queue, execution_timeout=timedelta(hours=1))
    health = FakeHealth(cloud, fixed_by=Rung.RESET_GPU)
    async with Worker(
        env.client,
        task_queue=f.task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(slurm, cloud, health, guard, [RecordingNotifier()]),
        interceptors=[MetricsInterceptor(f.metrics, env.client)],
    ):
        try:
            yield f
        finally:
            ids = [workflow_id(f.cluster, n) for n in ("gpu-01", "gpu-02")]
            for wf_id in [*ids, guard_workflow_id(f.cluster)]:
                try:
                    await env.client.get_workflow_handle(wf_id).terminate(reason="test over")
                except RPCError:
                    pass  # finished already, or never started


async def test_an_incident_is_measured_step_by_step_and_at_close(
    env: WorkflowEnvironment,
) -> None:
    async with fleet(env) as f:
        state: IncidentState = await (await f.open("gpu-01", policy=_policy())).result()
        assert state.status == "resolved"
        labels = {"cluster": f.cluster, "status": "resolved", "fault": "XID_79", "rung": "reboot"}

        async def closed() -> float:
            return value(f.metrics, "autoclusters_incidents_closed_total", **labels)

        assert await eventually(closed, what="the incident counted closed") == 1

    m, steps = f.metrics, "autoclusters_worker_step_duration_seconds_count"
    for step in ("guard_register", "drain_node", "requeue_jobs", "repair_node", "notify"):
        assert value(m, steps, activity=step, outcome="ok") >= 1, step
    assert value(m, steps, activity="notify", outcome="ok") == 2  # opened, resolved
    for kind in ("quarantine", "repair"):
        assert value(m, "autoclusters_guard_admissions_total",
                     cluster=f.cluster, kind=kind, outcome="admitted") == 1  # fmt: skip
    job = "autoclusters_incident_job_recovery_seconds"
    assert value(m, f"{job}_count", cluster=f.cluster, fault="XID_79") == 1
    expected_job = job_recovery(state)
    assert expected_job is not None
    assert value(m, f"{job}_sum", cluster=f.cluster, fault="XID_79") == pytest.approx(expected_job)
    cap = "autoclusters_incident_capacity_recovery_seconds"
    assert value(m, f"{cap}_count", cluster=f.cluster, fault="XID_79", via="repair") == 1
    assert value(m, f"{cap}_sum", cluster=f.cluster, fault="XID_79", via="repair") >= value(
        m, f"{job}_sum", cluster=f.cluster, fault="XID_79"
    )


async def test_the_collector_counts_open_incidents_and_reads_the_guard(
    env: WorkflowEnvironment,
) -> None:
    collector = TemporalCollector(env.client, cache_s=0)
    async with fleet(env) as f:
        f.metrics.registry.register(collector)
        waiting = await f.open("gpu-01", policy=_policy(mode="approve"))
        await f.open("gpu-02", policy=_policy(mode="approve"))
        labels = {"cluster": f.cluster, "fault": "XID_79", "rung": "reboot"}

        async def both_waiting() -> bool:
            await collector.refresh()
            n = value(f.metrics, "autoclusters_incidents", status="waiting_approval", **labels)
            return (
                n == 1 and value(f.metrics, "autoclusters_incidents", status="open", **labels) == 1
            )

        # gpu-01 waits for approval; gpu-02's quarantine is held (half the fleet in service).
        await eventually(both_waiting, what="one incident waiting approval, one held")
        m = f.metrics
        assert value(m, "autoclusters_guard_waiting", cluster=f.cluster, kind="quarantine") == 1
        assert value(m, "autoclusters_guard_out_of_service", cluster=f.cluster) == 1
        assert value(m, "autoclusters_guard_breaker_tripped", cluster=f.cluster) == 0
        assert value(m, "autoclusters_worker_temporal_up") == 1
        assert value(m, "autoclusters_guard_admissions_total",
                     cluster=f.cluster, kind="quarantine", outcome="held") >= 1  # fmt: skip
        await waiting.terminate(reason="test over")


async def test_the_collector_without_temporal_says_so() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    nowhere = await Client.connect(f"127.0.0.1:{port}", lazy=True)
    collector = TemporalCollector(nowhere, cache_s=0, timeout_s=1)
    await collector.refresh()
    metrics = WorkerMetrics()
    metrics.registry.register(collector)
    assert value(metrics, "autoclusters_worker_temporal_up") == 0
    assert not [k for k in samples(metrics) if k[0] == "autoclusters_incidents"]


async def test_the_endpoint_serves_the_text_format_on_loopback(env: WorkflowEnvironment) -> None:
    assert serve_metrics(env.client, None, 0) is None  # no metrics: nothing served
    metrics = WorkerMetrics()
    assert serve_metrics(env.client, metrics, None) is None  # no port: off
    metrics.slack_delivery("opened", "sent")
    server = serve_metrics(env.client, metrics, 0)  # as the worker does, on a free port
    assert server is not None
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            resp = await http.get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    # Scraped from the server's thread: the collector read Temporal through the loop.
    assert value(resp.content, "autoclusters_worker_temporal_up") == 1
    assert value(resp.content, "autoclusters_slack_deliveries_total",
                 event="opened", outcome="sent") == 1  # fmt: skip
    assert b"# TYPE autoclusters_worker_step_duration_seconds histogram" in resp.content


# --- Slack deliveries -------------------------------------------------------------------------


@pytest.fixture
def slack_url() -> Iterator[str]:
    config = EmulatorConfig(token="xoxb-test", signing_secret="s", users={})
    with EmulatorServer(create_app(config)) as server:
        yield server.url


async def test_slack_deliveries_are_counted_by_outcome(slack_url: str) -> None:
    metrics = WorkerMetrics()

    def notifier(token: str) -> SlackNotifier:
        client = slack_web_client(token=token, base_url=f"{slack_url}/api/", timeout_s=2)
        return SlackNotifier(
            client=client, channel="C00000001", send_timeout_s=5, on_delivery=metrics.slack_delivery
        )

    note = Notification(
        incident_id="INC-1", cluster="c", node="gpu-01", fault="XID_79", event="opened", text="x"
    )
    ok = notifier("xoxb-test")
    await ok.send(note)
    await ok.send(note)  # a retried activity: already in the thread
    await notifier("xoxb-wrong").send(note)
    name = "autoclusters_slack_deliveries_total"
    assert value(metrics, name, event="opened", outcome="sent") == 1
    assert value(metrics, name, event="opened", outcome="duplicate") == 1
    assert value(metrics, name, event="opened", outcome="slack_error") == 1


# --- recovery read off a timeline -------------------------------------------------------------


def _timeline(*steps: tuple[str, float], **state: Any) -> IncidentState:
    t0 = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    req = IncidentRequest(incident_id="INC-1", cluster="c", node="gpu-01", fault="XID_79",
                          opened_at=t0)  # fmt: skip
    records = [
        StepRecord(name=n, started_at=t0, finished_at=t0 + timedelta(seconds=s), outcome="ok")
        for n, s in steps
    ]
    return IncidentState(request=req, steps=records, **state)


def test_recovery_figures_from_the_timeline() -> None:
    repaired = _timeline(("requeue", 3), ("return_to_service", 66), status="resolved",
                         requeued_jobs=[101])  # fmt: skip
    assert job_recovery(repaired) == 3
    assert capacity_recovery(repaired) == (66, "repair")
    spare = _timeline(("requeue", 2), ("take_spare", 9), ("return_to_service", 70),
                      status="resolved", spare_node="gpu-09", requeued_jobs=[7])  # fmt: skip
    assert capacity_recovery(spare) == (9, "spare")
    # No job to requeue; a failed incident brought no capacity back.
    failed = _timeline(("requeue", 2), status="failed")
    assert job_recovery(failed) is None and capacity_recovery(failed) is None
