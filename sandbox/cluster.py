"""`sandbox up | status | down`: bring a whole local cluster up, report on it, stop it.

Order up: munged, the Temporal dev server, the Slack emulator and the Crusoe Cloud API
emulator (every mode: the machines are its VMs), started together → [Kubernetes API emulator
→ inference kubelet → inference gateway (sandbox/inference/launch.py; unless `inference` is
off) → the Crusoe emulator, which in Kubernetes mode starts here] → worker, API,
Alertmanager and Prometheus (sandbox/monitoring.py: the alert path to the API), started
together; then the
worker's `ClusterProvisioning` creates the Slurm cluster through the Crusoe emulator (the
controller, accounting, login endpoint and one machine per node, whose daemons — slurmd
and the node's health agent — the emulator's sandbox backend starts); then the spares are
parked.
A daemon that does not become ready stops the whole start: everything already started
is stopped again and the daemon's last log lines are shown.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from autoclusters.clients.agent import fake_backend
from autoclusters.core.models import SPARE_REASON, SlurmNode
from autoclusters.core.policy import BurnInScreen, default_policy, load_policy
from autoclusters.integrations.slurm import parse_jobs, parse_nodes
from autoclusters.sandbox import monitoring, previous_runs, provision
from autoclusters.sandbox.boot_slots import boot_slot
from autoclusters.sandbox.crusoe import cloud_api
from autoclusters.sandbox.inference import launch as inference_sandbox
from autoclusters.sandbox.machines import fault_effects
from autoclusters.sandbox.machines.vms import VmRegistry
from autoclusters.sandbox.runtime import api_tokens, daemons
from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig
from autoclusters.sandbox.runtime.daemon_failure import daemon_failed
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import (
    ProcessTable,
    kill_sessions,
    sessions_holding,
    stop_left_behind,
    wait_until,
)
from autoclusters.sandbox.slinky import cmk_platform
from autoclusters.sandbox.slinky import kubernetes_mode as slinky
from autoclusters.sandbox.slurm import controller as slurm_controller

WORKER = "worker"
API = "api"
SLACK = "slack-emulator"
# The provisioned cluster's daemons (the Crusoe emulator's sandbox backend names them so).
MARIADB, SLURMDBD, LOGIN = "mariadb", "slurmdbd", "sshd-login"


@dataclass
class UpResult:
    already_running: bool
    started: list[str] = field(default_factory=list)
    provision_s: float | None = None  # spec -> cluster ready (ClusterProvisioning)


def slurmd_name(node: str) -> str:
    return f"slurmd-{node}"


def agent_name(node: str) -> str:
    return f"agent-{node}"


# Started by `sandbox up` itself, before the cluster is provisioned.
_INFRA = (
    "munged", "temporal", slinky.K8S_EMULATOR, slinky.OPERATOR, inference_sandbox.KUBELET,
    inference_sandbox.GATEWAY, cloud_api.CRUSOE_EMULATOR, SLACK, WORKER, API,
    monitoring.ALERTMANAGER, monitoring.PROMETHEUS,
)  # fmt: skip


def _order(cfg: SandboxConfig) -> list[str]:
    """Start order: the infrastructure, then what provisioning creates (the controller, its
    accounting, the login endpoint, one slurmd per machine), then the node agents."""
    # The cloud API in every mode; Kubernetes (and the inference side on it) in k8s mode.
    inference = [inference_sandbox.KUBELET, inference_sandbox.GATEWAY] if cfg.inference else []
    emulators = [slinky.K8S_EMULATOR, *inference] if cfg.k8s else []
    emulators.append(cloud_api.CRUSOE_EMULATOR)
    accounting = [MARIADB, SLURMDBD] if cfg.accounting else []
    slurmds = list(map(slurmd_name, cfg.node_names()))
    agents = list(map(agent_name, cfg.node_names()))
    # The Slinky operator last: it is the first to stop, before the Nodes and Slurm nodes it
    # acts on go.
    operator = [slinky.OPERATOR] if cfg.k8s else []
    return [
        "munged", "temporal", *emulators, SLACK, WORKER, API,
        monitoring.ALERTMANAGER, monitoring.PROMETHEUS,
        *accounting, "slurmctld", LOGIN, *slurmds, *agents, *operator,
    ]  # fmt: skip


def is_running(cfg: SandboxConfig) -> bool:
    table = ProcessTable(cfg.state_dir)
    return all(table.alive(name) for name in _order(cfg))


def _prepare(cfg: SandboxConfig) -> None:
    d = cfg.state_dir
    # The emulator starts with an empty world: its Slurm cluster is provisioned anew, and
    # its job ids start again at 1, so an earlier run's job logs and checkpoints go too (a
    # job would append to them and resume from them).
    slurm_controller.forget(cfg)
    shutil.rmtree(d / "jobs", ignore_errors=True)
    shutil.rmtree(d / "emulators", ignore_errors=True)  # their worlds start empty too
    for sub in ("munge", "log", "temporal", "slurm/ctld", "dev", "pids", "jobs", "emulators"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    cfg.spool_dir.mkdir(parents=True, exist_ok=True)
    # munged insists the socket's directory be reachable and the key private.
    os.chmod(d / "munge", 0o755)
    key = d / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
    for i in range(GPUS_PER_NODE):
        (d / "dev" / f"nvidia{i}").touch()
    api_tokens.make(cfg)
    slack_secret = d / "slack" / "secret"
    if not slack_secret.exists():
        slack_secret.parent.mkdir(parents=True, exist_ok=True)
        slack_secret.write_text(secrets.token_hex(16))
        os.chmod(slack_secret, 0o600)
    handoff_secret = cfg.handoff_secret_file  # the ticket desk's (sandbox ticket serve)
    if not handoff_secret.exists():
        handoff_secret.parent.mkdir(parents=True, exist_ok=True)
        handoff_secret.write_text(secrets.token_hex(32))
        os.chmod(handoff_secret, 0o600)
    for node in cfg.node_names():  # every machine starts healthy, as its agent sees it
        (d / "agent").mkdir(parents=True, exist_ok=True)
        fake_backend.write_node(cfg.agent_file(node), fake_backend.healthy_node())
    cfg.settings_file.write_text(cfg.settings_toml())
    cfg.policy_file.write_text(sandbox_policy(cfg))
    cloud_api.prepare(cfg)
    provision.ensure_ssh_key(cfg)
    if cfg.k8s:
        slinky.prepare(cfg)
    cfg.save()


def sandbox_policy(
    cfg: SandboxConfig, mode: str = "auto", *, burn_in: bool = False, systemic: bool = False
) -> str:
    """The shipped default policy, with the sandbox's approvers; a small sandbox may have
    half its nodes out (the default 0.75 would freeze a 2-node sandbox). `burn_in`: the
    burn-in screen on, small (an 8 MiB gloo all-reduce on CPU: the screen's path, not a
    fabric's figures); the demo's policy has it. Off in the policy `sandbox up` writes,
    which the test suite's incidents and matrices run under (their timelines and bounds
    were measured without a screen). `systemic`: systemic incidents as shipped (on);
    off in the policy `sandbox up` writes, whose suites fault several nodes of one leaf
    at once to test each node's incident (`demo --scenario leaf` turns them on)."""
    policy = default_policy()
    guard = policy.guard.model_copy(
        update={
            "min_in_service_fraction": 0.5,
            "spares": cfg.spare_names(),
            "breaker_threshold": cfg.breaker_threshold,
            "systemic": policy.guard.systemic.model_copy(update={"enabled": systemic}),
        }
    )
    update: dict[str, object] = {"approvers": cfg.approvers, "guard": guard, "mode": mode}
    header = "# Written by `autoclusters sandbox up`: the shipped default, sandbox approvers"
    if burn_in:
        update["burn_in"] = BurnInScreen(enabled=True, timeout_s=300, size_mib=8, rounds=3)
        header += ", the burn-in screen on"
    policy = policy.model_copy(update=update)
    header += ".\n"
    return header + yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False)


def sinfo(cfg: SandboxConfig) -> list[SlurmNode]:
    r = subprocess.run(
        [daemons.require("sinfo"), "--json"],
        env={**os.environ, **daemons.slurm_env(cfg)},
        capture_output=True,
        timeout=15,
    )
    if r.returncode != 0:
        return []
    return parse_nodes(json.loads(r.stdout))


def _park_spares(cfg: SandboxConfig) -> None:
    for node in cfg.spare_names():
        subprocess.run(
            [daemons.require("scontrol"), "update", f"NodeName={node}", "State=DRAIN",
             f"Reason={SPARE_REASON}"],
            env={**os.environ, **daemons.slurm_env(cfg)}, check=True, capture_output=True,
        )  # fmt: skip


def _worker_polling(cfg: SandboxConfig) -> bool:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.client import Client

    async def pollers() -> int:
        client = await Client.connect(cfg.temporal_address)
        resp = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace="default",
                task_queue=TaskQueue(name=cfg.task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
        return len(resp.pollers)

    return asyncio.run(pollers()) > 0


def up(cfg: SandboxConfig, timeout_s: float = 60) -> UpResult:
    """The infrastructure (munged, Temporal, the emulators, Slack, the worker, the API),
    then the Slurm cluster through `ClusterProvisioning` (sandbox/provision.py: each
    machine's slurmd and health agent start as its VM boots), then the spares parked."""
    table = ProcessTable(cfg.state_dir)
    if cfg.record_file.exists():
        running = SandboxConfig.load(cfg.state_dir)
        if is_running(running):
            return UpResult(already_running=True)
        if any(table.alive(r.name) for r in table.records()):
            raise SandboxError(
                f"a sandbox in {cfg.state_dir} is partly running; "
                "run `autoclusters sandbox down` first"
            )
    # Boots take turns with other sandboxes booting on this machine (sandbox/boot_slots.py).
    with boot_slot():
        return _boot(cfg, table, timeout_s)


def _boot(cfg: SandboxConfig, table: ProcessTable, timeout_s: float) -> UpResult:
    _prepare(cfg)
    result = UpResult(already_running=False)
    VmRegistry(cfg.state_dir).reset([])  # the machines are created by the provisioning
    try:
        # A previous life's history is there only if its database was (a first boot has none).
        had_history = (cfg.state_dir / "temporal" / "temporal.db").exists()
        crusoe = _Daemon(
            cloud_api.CRUSOE_EMULATOR,
            cloud_api.crusoe_emulator_argv(cfg),
            cloud_api.crusoe_emulator_env(cfg),
            lambda: cloud_api.answers(cfg.crusoe_port, "/_emulator/health"),
        )
        # What needs nothing of the others starts together (its start-ups overlap): munged,
        # Temporal, the Slack emulator and, but in Kubernetes mode (where it follows the
        # Kubernetes emulator), the Crusoe emulator.
        _start_together(
            table,
            [
                _Daemon("munged", daemons.munged_argv(cfg), {}, lambda: daemons.munge_ready(cfg)),
                temporal_daemon(cfg),
                *([] if cfg.k8s else [crusoe]),
                _Daemon(
                    SLACK,
                    daemons.slack_emulator_argv(cfg),
                    {},
                    lambda: daemons.port_open(cfg.slack_port),
                ),
            ],
            timeout_s,
            result,
        )
        if had_history:
            asyncio.run(_close_previous_runs(cfg))
        if cfg.k8s:
            # The inference pods are run by the sandbox's inference kubelet (and on CMK, the
            # Slurm pods by the Slinky operator's).
            external = (
                cmk_platform.emulator_args() if cfg.cmk else inference_sandbox.emulator_args()
            )
            _start(
                table,
                slinky.K8S_EMULATOR,
                slinky.k8s_emulator_argv(cfg) + external,
                {},
                lambda: slinky.k8s_answers(cfg),
                timeout_s,
                result,
            )
            if cfg.cmk:
                # The provider makes the NodeSets; the control pods need the system node.
                cmk_platform.register_system_node(cfg)
            else:
                slinky.seed(cfg)
            _start(
                table,
                slinky.OPERATOR,
                slinky.operator_argv(cfg) + (cmk_platform.operator_args(cfg) if cfg.cmk else []),
                daemons.slurm_env(cfg),
                lambda: True,  # a controller: nothing to wait for, its passes retry
                timeout_s,
                result,
            )
            if cfg.inference:
                start_inference(cfg, table, timeout_s, result)
        if cfg.k8s:
            _start_together(table, [crusoe], timeout_s, result)
        if cfg.cmk:
            # The customer's CMK cluster, before the worker starts: its settings name it.
            cfg.cmk_cluster_id = asyncio.run(cmk_platform.create_cluster(cfg))
            cfg.settings_file.write_text(cfg.settings_toml())
            cfg.save()
        # The worker and the API need Temporal; Alertmanager and Prometheus (the alert path
        # to the API's webhook) need nothing to start: all four start together.
        monitoring.prepare(cfg)
        _start_together(
            table,
            [worker_daemon(cfg), api_daemon(cfg), *monitoring_daemons(cfg)],
            timeout_s,
            result,
        )
        policy = load_policy(cfg.policy_file)
        budget = max(180.0, timeout_s + 6 * cfg.boot_delay_s)
        done = asyncio.run(provision.provision(cfg, policy, budget))
        result.provision_s = done.seconds
        result.started += [n for n in _cluster_processes(cfg) if n not in result.started]
        _park_spares(cfg)
        order = _order(cfg)
        result.started.sort(key=lambda n: order.index(n) if n in order else len(order))
    except BaseException:
        down(cfg)
        raise
    return result


def _cluster_processes(cfg: SandboxConfig) -> list[str]:
    """What the provisioning started (the emulator's machines and the Slurm controller)."""
    return [n for n in _order(cfg) if n not in _INFRA and ProcessTable(cfg.state_dir).alive(n)]


def worker_daemon(cfg: SandboxConfig) -> _Daemon:
    """The worker, ready once it polls its task queue."""
    return _Daemon(
        WORKER, daemons.worker_argv(cfg), daemons.worker_env(cfg), lambda: _worker_polling(cfg)
    )


def api_daemon(cfg: SandboxConfig) -> _Daemon:
    return _Daemon(
        API, daemons.api_argv(cfg), daemons.worker_env(cfg), lambda: daemons.port_open(cfg.api_port)
    )


def start_inference(
    cfg: SandboxConfig, table: ProcessTable, timeout_s: float, result: UpResult
) -> None:
    """The inference namespace and Deployment (replicas 0), the kubelet that runs its pods'
    servers, and the gateway in front of them (sandbox/inference/launch.py)."""
    inference_sandbox.seed(cfg)
    _start(
        table,
        inference_sandbox.KUBELET,
        inference_sandbox.kubelet_argv(cfg),
        {},
        lambda: True,
        timeout_s,
        result,
    )
    _start(
        table,
        inference_sandbox.GATEWAY,
        inference_sandbox.gateway_argv(cfg),
        {},
        lambda: inference_sandbox.gateway_ready(cfg),
        timeout_s,
        result,
    )


def monitoring_daemons(cfg: SandboxConfig) -> list[_Daemon]:
    """Alertmanager and Prometheus (which sends it alerts): the real alert path to the API's
    webhook, scraping the agents as their machines boot (sandbox/monitoring.py; its
    `prepare` first)."""
    return [
        _Daemon(
            monitoring.ALERTMANAGER,
            monitoring.alertmanager_argv(cfg),
            {},
            lambda: monitoring.ready(cfg.alertmanager_url),
        ),
        _Daemon(
            monitoring.PROMETHEUS,
            monitoring.prometheus_argv(cfg),
            {},
            lambda: monitoring.ready(cfg.prometheus_url),
        ),
    ]


async def _close_previous_runs(cfg: SandboxConfig) -> None:
    from temporalio.client import Client

    # Temporal is started and healthy (daemons.temporal_ready): one connect.
    client = await Client.connect(cfg.temporal_address)
    await previous_runs.close_previous_runs(client)


def temporal_daemon(cfg: SandboxConfig) -> _Daemon:
    return _Daemon("temporal", daemons.temporal_argv(cfg), {}, lambda: daemons.temporal_ready(cfg))


@dataclass
class _Daemon:
    """One daemon of the boot: how it starts, and how we know it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready: Callable[[], bool]


def _start(
    table: ProcessTable,
    name: str,
    argv: list[str],
    env: dict[str, str],
    ready: Callable[[], bool],
    timeout_s: float,
    result: UpResult,
) -> None:
    _start_together(table, [_Daemon(name, argv, env, ready)], timeout_s, result)


def _start_together(
    table: ProcessTable, daemons_: list[_Daemon], timeout_s: float, result: UpResult
) -> None:
    """Start daemons that do not need each other at once, then wait until each is ready
    (one after the other, a boot waited out each one's start-up in turn). One that exits
    or is not ready in `timeout_s` stops the boot, named with its log's last lines."""
    for d in daemons_:
        table.spawn(d.name, d.argv, d.env)
        result.started.append(d.name)
    waiting = list(daemons_)

    def ok(d: _Daemon) -> bool:
        if not table.alive(d.name):
            raise daemon_failed(table, d.name, f"{d.name} exited")
        try:
            return bool(d.ready())
        except Exception:
            return False

    def all_ready() -> bool:
        waiting[:] = [d for d in waiting if not ok(d)]
        return not waiting

    if not wait_until(all_ready, timeout_s, 0.2):
        raise daemon_failed(
            table, waiting[0].name, f"{waiting[0].name} not ready after {timeout_s:.0f}s"
        )


def cancel_all_jobs(cfg: SandboxConfig, timeout_s: float = 30) -> None:
    """Jobs run in slurmstepd processes outside slurmd: end them before slurmd goes."""
    env = {**os.environ, **daemons.slurm_env(cfg)}

    def jobs_alive() -> bool:
        r = subprocess.run(
            [daemons.require("squeue"), "--json"], env=env, capture_output=True, timeout=15
        )
        if r.returncode != 0:
            return False
        return any(
            j.job_state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")
            for j in parse_jobs(json.loads(r.stdout))
        )

    # A loaded machine's scancel once took longer than 15 s.
    subprocess.run(
        [daemons.require("scancel"), "--user", "root"], env=env, capture_output=True, timeout=60
    )
    wait_until(lambda: not jobs_alive(), timeout_s, 0.5)


def down(cfg: SandboxConfig) -> list[str]:
    """Stop exactly the processes this sandbox recorded, newest first; return their names."""
    table = ProcessTable(cfg.state_dir)
    # Faults' effects end first: a stopped slurmd or step is killed by its PID, the duty
    # cycles stop, the sandbox's nftables table goes (sandbox/machines/fault_effects.py).
    fault_effects.down(cfg)
    if table.alive("slurmctld"):
        cancel_all_jobs(cfg)
    stopped = []
    # The inference kubelet first: it would start again the servers stopped below.
    if table.stop(inference_sandbox.KUBELET):
        stopped.append(inference_sandbox.KUBELET)
    order = _order(cfg)
    # Slurmd processes started by the Crusoe emulator's machines (replacements) are recorded too.
    records = sorted(
        table.records(),
        key=lambda r: -order.index(r.name) if r.name in order else -len(order),
    )
    for rec in records:
        if rec.name == "slurmctld":
            # Job steps that outlived their slurmd (it was killed mid-job) go with the nodes.
            kill_sessions(sessions_holding(cfg.spool_dir))
        if table.stop(rec.name):
            stopped.append(rec.name)
    # A repair in flight when its emulator was told to stop may still have started a slurmd:
    # whatever is recorded now goes too.
    leaders = {rec.pid for rec in records}
    for rec in table.records():
        leaders.add(rec.pid)
        if table.stop(rec.name):
            stopped.append(rec.name)
    kill_sessions(sessions_holding(cfg.spool_dir))
    # A command a daemon had running when it was stopped (an `sinfo` of the API's) goes too.
    for pid, argv in stop_left_behind(cfg.state_dir, leaders):
        stopped.append(f"{Path(argv[0]).name if argv else 'pid'} ({pid}, left by a daemon)")
    shutil.rmtree(cfg.spool_dir, ignore_errors=True)  # nothing runs from it any more
    return stopped


@dataclass
class ProcessStatus:
    name: str
    pid: int
    alive: bool


def status(cfg: SandboxConfig) -> tuple[list[ProcessStatus], list[SlurmNode]]:
    table = ProcessTable(cfg.state_dir)
    procs = [ProcessStatus(r.name, r.pid, table.alive(r.name)) for r in table.records()]
    nodes = sinfo(cfg) if table.alive("slurmctld") else []
    return procs, nodes


def load(state_dir: Path) -> SandboxConfig:
    if not (state_dir / "autoclusters.sandbox.json").exists():
        raise SandboxError(f"no sandbox in {state_dir}")
    return SandboxConfig.load(state_dir)
