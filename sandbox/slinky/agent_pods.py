"""The emulated kubelet's part for the agent's DaemonSet pods (CMK platform): each pod's
container is a process on this machine, started as sandbox/slinky/agent_daemonset.py renders the
pod's spec, recorded in the sandbox's ProcessTable as `agent-<Slurm node>` (the name
`sandbox down`, restarts and chaos know), and reported on the pod: Running and Ready with
`containerID: pid://<PID>` and its restartCount.

- a pod starts once its Node's Slurm node is known (the Node's slurmd pod, or Slinky's
  hostname-override annotation): that name is the agent's (agent_daemonset NODE_NAME);
- a container whose process died is started again in the same pod (restartPolicy Always:
  restartCount + 1);
- a deleted pod's process is stopped by its PID, then its deletion completes, and the
  DaemonSet's new pod starts a new process;
- a pod gone with its Node (a machine deleted, a scale-in) leaves a process no pod owns:
  it is stopped by its PID, and Prometheus stops scraping it;
- a new Node under a Slurm node's name (a replaced machine) starts its agent without the old
  machine's memory, as a new disk would.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
from kubernetes import client

from autoclusters.clients.agent import fake_backend
from autoclusters.core.kubernetes import is_ready
from autoclusters.sandbox.machines import agent_targets
from autoclusters.sandbox.machines import backend as machines
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable, _exited, wait_until
from autoclusters.sandbox.slinky import agent_daemonset as shipped
from autoclusters.sandbox.slinky import operator_pods as pods

Obj = dict[str, Any]
PREFIX = "agent-"
TIMEOUT_S = 10
log = logging.getLogger(__name__)


def is_agent_pod(pod: Obj) -> bool:
    return (pod["metadata"].get("labels") or {}).get(shipped.APP_LABEL) == shipped.APP


class AgentPods:
    def __init__(self, core: client.CoreV1Api, cfg: SandboxConfig) -> None:
        self._core = core
        self._cfg = cfg
        self._table = ProcessTable(cfg.state_dir)
        self._machine: dict[str, str] = {}  # Slurm node -> the Node uid its agent last ran on
        # Slurm node -> (the pod uid, the PID) its agent runs for; after a restart of this
        # kubelet, the PID the pod's status reports says the same.
        self._owner: dict[str, tuple[str, int]] = {}

    def sync(self, every: list[Obj], nodes: dict[str, Obj], slurmds: list[Obj]) -> list[str]:
        """One pass over the agent pods; what it changed, one line each."""
        done: list[str] = []
        ours = [p for p in every if is_agent_pod(p)]
        slurm_of = {
            name: pods.hostname_of(node)
            for name, node in nodes.items()
            if pods.HOSTNAME_OVERRIDE in (node["metadata"].get("annotations") or {})
        }
        slurm_of |= {pods.node_of(p): pods.slurm_name(p) for p in slurmds}
        with httpx.Client(
            base_url=self._cfg.k8s_url, timeout=TIMEOUT_S, verify=self._cfg.k8s_tls()
        ) as k8s:
            # A deleted pod's container first: its process may be the one a new pod replaces.
            for pod in [p for p in ours if pods.terminating(p)]:
                done += self._stop_pod(pod)
                _post(k8s, pod, "terminated")
            wanted: set[str] = set()
            for pod in [p for p in ours if not pods.terminating(p)]:
                node = nodes.get(pods.node_of(pod))
                slurm = slurm_of.get(pods.node_of(pod))
                if node is None or slurm is None:
                    continue  # not yet: the Node's Slurm node is not known
                wanted.add(slurm)
                done += self._run(k8s, pod, node, slurm)
        for rec in self._table.records():
            slurm = rec.name.removeprefix(PREFIX)
            if rec.name.startswith(PREFIX) and slurm not in wanted and self._table.alive(rec.name):
                machines.stop_agent(self._cfg, slurm)  # no pod owns it: its Node went
                done.append(f"stopped {rec.name} (no pod)")
        return done

    def _owns(self, pod: Obj, slurm: str, pid: int) -> bool:
        return self._owner.get(slurm) == (pod["metadata"]["uid"], pid) or (
            shipped.pid_of(pod) == pid
        )

    def _stop_pod(self, pod: Obj) -> list[str]:
        for rec in self._table.records():
            slurm = rec.name.removeprefix(PREFIX)
            if (
                rec.name.startswith(PREFIX)
                and self._owns(pod, slurm, rec.pid)
                and self._table.alive(rec.name)
            ):
                machines.stop_agent(self._cfg, rec.name.removeprefix(PREFIX))
                return [f"stopped {rec.name} (pod {pod['metadata']['name']} deleted)"]
        return []

    def _run(self, k8s: httpx.Client, pod: Obj, node: Obj, slurm: str) -> list[str]:
        name = f"{PREFIX}{slurm}"
        rec = self._table.get(name)
        up = is_ready(node)  # a machine down (a reset): its pod is not Ready meanwhile
        if rec is not None and self._table.alive(name) and self._owns(pod, slurm, rec.pid):
            self._owner[slurm] = (pod["metadata"]["uid"], rec.pid)
            if _ready(pod) != up or shipped.pid_of(pod) != rec.pid:
                _post(k8s, pod, "ready", ready=up, container_id=_cid(rec.pid))
            return []
        ran = self._owner.get(slurm, ("", 0))[0] == pod["metadata"]["uid"]
        # Not this pod's process (an earlier pod's, or one whose pod was never told): gone.
        if self._table.alive(name):
            machines.stop_agent(self._cfg, slurm)
        uid = str(node["metadata"].get("uid") or node["metadata"]["name"])
        before = self._machine.get(slurm)
        if before is not None and before != uid:
            machines.forget_old_machine(self._cfg, slurm)
        try:
            container = shipped.render(self._cfg, pod["spec"], shipped.Node(
                name=node["metadata"]["name"], slurm=slurm), self._secret(pod))  # fmt: skip
        except SandboxError as e:  # a drifted manifest, a missing Secret: the pod waits
            log.error("agent pod %s cannot start: %s", pod["metadata"]["name"], e)
            return [f"{name} cannot start: {e}"]
        for path in container.mounts.values():
            path.mkdir(parents=True, exist_ok=True)  # hostPath DirectoryOrCreate
        if not self._cfg.agent_file(slurm).exists():  # a node beyond the sandbox's own
            self._cfg.agent_file(slurm).parent.mkdir(parents=True, exist_ok=True)
            fake_backend.write_node(self._cfg.agent_file(slurm), fake_backend.healthy_node())
        new = self._table.spawn(name, container.argv, container.env)
        self._machine[slurm] = uid
        self._owner[slurm] = (pod["metadata"]["uid"], new.pid)
        agent_targets.add(self._cfg, slurm)  # Prometheus scrapes it from now on
        ran = ran or shipped.pid_of(pod) is not None
        restarts = shipped.restarts_of(pod) + (1 if ran else 0)
        _post(k8s, pod, "ready", ready=up, container_id=_cid(new.pid), restart_count=restarts)
        return [f"{name} runs as pod {pod['metadata']['name']} (pid {new.pid})"]

    def _secret(self, pod: Obj) -> Any:
        ns = pod["metadata"]["namespace"]

        def read(name: str, key: str) -> str | None:
            try:
                resp: Any = self._core.read_namespaced_secret(
                    name, ns, _preload_content=False, _request_timeout=TIMEOUT_S
                )
            except client.ApiException as e:
                if e.status == 404:
                    return None
                raise
            data = (json.loads(resp.data).get("data") or {}).get(key)
            return base64.b64decode(data).decode() if data is not None else None

        return read


def _cid(pid: int) -> str:
    return f"{shipped.CONTAINER_ID}{pid}"


def _ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _post(k8s: httpx.Client, pod: Obj, what: str, **body: Any) -> None:
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    r = k8s.post(f"/_emulator/pods/{ns}/{name}/{what}", json=body or None)
    if r.status_code not in (200, 404, 409):  # 404/409: gone or finished meanwhile
        r.raise_for_status()


# --- `sandbox restart agent-<node>` on CMK -------------------------------------------------


def _pods(cfg: SandboxConfig) -> list[Obj]:
    r = httpx.get(
        f"{cfg.k8s_url}/api/v1/namespaces/{shipped.NAMESPACE}/pods",
        params={"labelSelector": f"{shipped.APP_LABEL}={shipped.APP}"},
        headers={"Authorization": f"Bearer {cfg.k8s_token()}"},
        timeout=TIMEOUT_S,
        verify=cfg.k8s_tls(),
    )
    r.raise_for_status()
    items: list[Obj] = r.json().get("items") or []
    return items


def restart(
    cfg: SandboxConfig,
    name: str,
    *,
    kill: bool,
    timeout_s: float,
    between: Callable[[], object] | None = None,
) -> tuple[int, int]:
    """An agent restarted as Kubernetes restarts a DaemonSet's pod: SIGTERM is `kubectl
    delete pod` (the kubelet stops the process by its PID, the DaemonSet makes a new pod,
    whose new process this waits for); SIGKILL is a crashed container (the kubelet starts
    it again in the same pod, restartCount + 1). (old PID, new PID)."""
    table = ProcessTable(cfg.state_dir)
    rec = table.get(name)
    if rec is None or not table.alive(name):
        raise SandboxError(f"{name} is not running in the sandbox in {cfg.state_dir}")
    pod = next((p for p in _pods(cfg) if shipped.pid_of(p) == rec.pid), None)
    if pod is None:
        raise SandboxError(f"{name} (pid {rec.pid}) is no agent pod's container")
    uid, node = pod["metadata"]["uid"], pods.node_of(pod)
    if kill:
        table.kill(name)
    else:
        r = httpx.delete(
            f"{cfg.k8s_url}/api/v1/namespaces/{shipped.NAMESPACE}/pods/{pod['metadata']['name']}",
            headers={"Authorization": f"Bearer {cfg.k8s_token()}"},
            timeout=TIMEOUT_S,
            verify=cfg.k8s_tls(),
        )
        r.raise_for_status()
        if not wait_until(lambda: _exited(rec), timeout_s, 0.1):
            raise SandboxError(f"{name}: pid {rec.pid} still runs {timeout_s:.0f} s after its pod")
    if between is not None:
        between()

    def replaced() -> bool:
        new = table.get(name)
        if new is None or new.pid == rec.pid or not table.alive(name):
            return False
        for p in _pods(cfg):
            same = p["metadata"]["uid"] == uid
            if pods.node_of(p) == node and same == kill and shipped.pid_of(p) == new.pid:
                return True
        return False

    if not wait_until(replaced, timeout_s, 0.2):
        raise SandboxError(f"{name}: no new agent pod process within {timeout_s:.0f} s")
    new = table.get(name)
    assert new is not None
    return rec.pid, new.pid
