"""The emulated kubelet of a CMK-platform sandbox: it runs the containers of the Slinky
operator's pods as the real daemons, on this machine, and reports the pods Ready once their
daemon answers (the Kubernetes emulator leaves these pods to it: `--external-kubelet`).

- the Controller's pod (`app.kubernetes.io/name=slurmctld`) is slurmctld, its slurm.conf
  rendered from what a real slurmctld pod is given: the Controller's `configFileRefs`
  ConfigMaps (topology.conf), the Accounting (slurmdbd when its pod runs), and the nodes of
  the NodeSets' slurmd pods, in each NodeSet's partition (`spec.partition.config`);
- the Accounting's pod is slurmdbd on a private MariaDB; the LoginSet's pod is sshd (root's
  keys: the LoginSet's `rootSshAuthorizedKeys`);
- each slurmd pod is `slurmd -N <node>`, <node> the pod's Slurm node (the Node's
  hostname-override, else its name: sandbox/slinky/operator_pods.py);
- each pod of the agent's DaemonSet (deploy/kubernetes/agent.yaml, applied as shipped) is
  the node agent, started from the pod's spec (sandbox/slinky/agent_pods.py,
  sandbox/slinky/agent_daemonset.py).

The daemons are started the Managed Slurm way (sandbox/slurm/controller.py, shared) and
recorded in the sandbox's ProcessTable under the same names (`slurmctld`, `slurmd-<node>`,
...), so `sandbox down`, restarts and chaos find them; a daemon whose pod is gone is
stopped by its PID. The Crusoe emulator stops a machine's slurmd too (a VM deleted, reset
or stopped: sandbox/machines/backend.py) while this kubelet may be starting it again: the table
does both under the name's lock and records a daemon before it runs
(sandbox/runtime/processes.py), so no slurmd ever runs without a record.

A Slurm node whose pod went with its Node (a machine deleted, a replacement on its way)
stays declared, DOWN, as Slinky's does (its preStop hook marks it DOWN; nothing deletes
it): the runbook and the guard keep reading it while its new machine boots, and the new
Node's pod brings its slurmd back under the same name. It goes from slurm.conf only when
the operator scales it in (`forget`), its Node is renamed (a new hostname-override), or
its NodeSet is gone.

Slinky's slurmd registers as a dynamic node (`slurmd -Z`). Slurm 22.05 (Debian's) cannot do
that here: several dynamic slurmds on one host need an address each (22.05 refuses `Port=`
in `--conf`; 23.11 takes it), dynamic nodes break topology/tree (every job is "Requested
node configuration is not available") and vanish when slurmctld starts with `-c`. So the
kubelet declares the pods' nodes as static `NodeName` lines, and slurmctld is restarted when
the list changes (22.05 reads it only at start), as Managed Slurm does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from kubernetes import client

from autoclusters.core.kubernetes import is_ready
from autoclusters.sandbox.machines import backend as machines
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable
from autoclusters.sandbox.slinky import operator_pods as pods
from autoclusters.sandbox.slinky.agent_pods import AgentPods
from autoclusters.sandbox.slinky.operator_workloads import APP, owner_of
from autoclusters.sandbox.slurm.controller import (
    LOGIN,
    SLURMCTLD,
    SLURMDBD,
    ManagedSlurm,
    forget,
    ssh_answers,
)
from autoclusters.sandbox.slurm.files import Layout, NodeDef
from autoclusters.sandbox.slurm.topology import place_unplaced

Obj = dict[str, Any]
HEADER = "Written by the emulated Slinky kubelet (slurmctld's pod)"
DAEMONS = ("slurmctld", "slurmdbd", "login", "slurmd")
TIMEOUT_S = 10


def _json(resp: Any) -> Any:
    """A call's answer as the API's own JSON (`_preload_content=False`)."""
    return json.loads(resp.data)


class SlinkyKubelet:
    def __init__(self, api: client.ApiClient, cfg: SandboxConfig) -> None:
        self._core = client.CoreV1Api(api)
        self._crs = client.CustomObjectsApi(api)
        self._cfg = cfg
        self._table = ProcessTable(cfg.state_dir)
        self._slurm = ManagedSlurm(cfg, machines.power_on)
        self._applied: tuple[object, ...] | None = None  # the layout slurmctld runs
        # The agent's DaemonSet pods (deploy/kubernetes/agent.yaml): sandbox/slinky/agent_pods.py.
        self._agent_pods = AgentPods(self._core, cfg)
        # Every Slurm node declared from a pod, as last declared (its partition and its
        # NodeSet (namespace, name)): declared on, DOWN, once its pod is gone with its Node.
        self._declared: dict[str, tuple[NodeDef, str, tuple[str, str]]] = {}

    def forget(self, slurm_node: str) -> None:
        """The operator removes this Slurm node (a scale-in, a renamed Node): its pod's
        going takes it out of slurm.conf."""
        self._declared.pop(slurm_node, None)

    # --- reading -------------------------------------------------------------------------

    def _get(self, plural: str, ns: str, name: str) -> Obj | None:
        try:
            resp = self._crs.get_namespaced_custom_object(
                pods.GROUP, pods.VERSION, ns, plural, name,
                _preload_content=False, _request_timeout=TIMEOUT_S,
            )  # fmt: skip
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        doc: Obj = _json(resp)
        return doc

    def _config_files(self, controller: Obj | None, ns: str) -> dict[str, str]:
        files: dict[str, str] = {}
        for ref in ((controller or {}).get("spec") or {}).get("configFileRefs") or []:
            try:
                resp = self._core.read_namespaced_config_map(
                    ref["name"], ns, _preload_content=False, _request_timeout=TIMEOUT_S
                )
            except client.ApiException as e:
                if e.status == 404:
                    continue  # not written yet: the cluster has no topology yet
                raise
            files.update(_json(resp).get("data") or {})
        return files

    def _layout(
        self, slurmds: list[Obj], nodes: dict[str, Obj], accounting: bool, topology: str
    ) -> Layout:
        names = sorted({pods.slurm_name(p) for p in slurmds})
        ports = self._slurm.ports(names) if names else {}
        defs: list[NodeDef] = []
        partitions: dict[str, list[str]] = {}
        nodesets: dict[tuple[str, str], Obj | None] = {}
        for pod in sorted(slurmds, key=pods.slurm_name):
            name, node = pods.slurm_name(pod), nodes[pods.node_of(pod)]
            if name in {d.name for d in defs}:
                continue
            capacity = (node.get("status") or {}).get("capacity") or {}
            gpus = int(capacity.get("nvidia.com/gpu", GPUS_PER_NODE))
            notes = node["metadata"].get("annotations") or {}
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            drained = notes.get(pods.NODE_CORDON_REASON) if cordoned else None
            defs.append(NodeDef(name, ports[name], gpus, drained or None))
            ref = owner_of(pod) or {}
            key = (pod["metadata"]["namespace"], str(ref.get("name", "")))
            if key not in nodesets:
                nodesets[key] = self._get(pods.NODESETS, *key)
            partition = _partition(nodesets[key], key[1])
            partitions.setdefault(partition, []).append(name)
            self._declared[name] = (defs[-1], partition, key)
        # The Slurm nodes whose pod went with its Node: still declared (DOWN), while their
        # NodeSet is there.
        for name, (lost, partition, key) in sorted(self._declared.items()):
            if name in {d.name for d in defs}:
                continue
            if key not in nodesets:
                nodesets[key] = self._get(pods.NODESETS, *key)
            if nodesets[key] is None:
                del self._declared[name]
                continue
            defs.append(lost)
            partitions.setdefault(partition, []).append(name)
        return Layout(
            nodes=defs,
            partitions=partitions,
            accounting=accounting,
            topology=bool(topology.strip()),
            header=HEADER,
        )

    # --- one pass --------------------------------------------------------------------------

    def sync_once(self) -> list[str]:
        """Run what the pods say, stop what no pod runs, report readiness. Returns what it
        changed, one line each."""
        done: list[str] = []
        every = (
            _json(
                self._core.list_pod_for_all_namespaces(
                    _preload_content=False, _request_timeout=TIMEOUT_S
                )
            ).get("items")
            or []
        )
        ours = [p for p in every if _app(p) in DAEMONS and owner_of(p) is not None]
        live = [p for p in ours if not pods.terminating(p)]
        nodes = {
            n["metadata"]["name"]: n
            for n in _json(
                self._core.list_node(_preload_content=False, _request_timeout=TIMEOUT_S)
            ).get("items")
            or []
        }
        by_app: dict[str, list[Obj]] = {a: [] for a in DAEMONS}
        for p in live:
            if pods.node_of(p) in nodes:
                by_app[_app(p)].append(p)
        ctl, acct, login = by_app["slurmctld"], by_app["slurmdbd"], by_app["login"]
        slurmds = by_app["slurmd"] if ctl else []
        # Which Slurm node each machine is, for the machines' fault, repair and boot path.
        machine_names.record(self._cfg, {pods.node_of(p): pods.slurm_name(p) for p in slurmds})
        # A machine that is down (its Node NotReady: a reset, a stop) runs no container; its
        # node stays in slurm.conf (slurmctld marks it down, as it would a dead slurmd).
        up = {pods.slurm_name(p) for p in slurmds if is_ready(nodes[pods.node_of(p)])}

        if ctl or acct or login:
            ns = (ctl or acct or login)[0]["metadata"]["namespace"]
            owner = owner_of(ctl[0]) if ctl else None
            controller = self._get("controllers", ns, owner["name"]) if owner else None
            topology = self._config_files(controller, ns).get("topology.conf", "")
            layout = self._layout(slurmds, nodes, bool(acct), topology)
            # A scaled-out node is in no switch of the ConfigMap's: on one of its own.
            topology = place_unplaced(topology, [d.name for d in layout.nodes])
            if not self._cfg.slurm_conf.exists():
                self._slurm.prepare(bool(acct), HEADER)
            if acct and not self._table.alive(SLURMDBD):
                if not self._table.alive(SLURMCTLD):
                    self._slurm.write_conf(layout, topology)  # sacctmgr reads the dbd's port
                self._slurm.start_accounting()
                done.append("started slurmdbd")
            if login and not self._table.alive(LOGIN):
                self._slurm.start_login(self._root_keys(login[0]))
                done.append("started sshd-login")
            if ctl:
                key = (repr(layout), topology)
                if key != self._applied or (layout.nodes and not self._table.alive(SLURMCTLD)):
                    running = [d.name for d in layout.nodes if d.name in up]
                    self._slurm.apply(layout, topology, running)
                    self._applied = key
                    done.append(f"slurmctld runs {running}")
                else:
                    for d in layout.nodes:
                        if d.name in up:
                            machines.power_on(self._cfg, d.name)
        if not login and self._table.stop(LOGIN):
            done.append("stopped sshd-login")
        if not ctl:
            self._applied = None
            if self._table.stop(SLURMCTLD):
                done.append("stopped slurmctld")
        if not acct:
            done += [f"stopped {n}" for n in self._slurm.stop_accounting()]
        if not ctl and not acct and self._slurm.declared():
            forget(self._cfg)  # the cluster is gone: one made later starts afresh
            self._declared.clear()
        done += self._stop_unwanted({pods.slurm_name(p) for p in slurmds})
        done += self._agent_pods.sync(every, nodes, by_app["slurmd"])
        self._report(live, ours)
        return done

    def _root_keys(self, login_pod: Obj) -> list[str]:
        ref = owner_of(login_pod) or {}
        loginset = self._get("loginsets", login_pod["metadata"]["namespace"], ref.get("name", ""))
        keys = str(((loginset or {}).get("spec") or {}).get("rootSshAuthorizedKeys") or "")
        return [k for k in keys.splitlines() if k.strip()]

    def _stop_unwanted(self, wanted: set[str]) -> list[str]:
        done = []
        for rec in self._table.records():
            node = rec.name.removeprefix("slurmd-")
            if rec.name.startswith("slurmd-") and node not in wanted and self._alive(rec.name):
                machines.power_off(self._cfg, node)
                done.append(f"stopped {rec.name}")
        return done

    def _alive(self, name: str) -> bool:
        return self._table.alive(name)

    # --- the pods' status ------------------------------------------------------------------

    def _running(self, pod: Obj) -> bool:
        app = _app(pod)
        name = {"slurmctld": SLURMCTLD, "slurmdbd": SLURMDBD, "login": LOGIN}.get(app)
        return self._alive(name or f"slurmd-{pods.slurm_name(pod)}")

    def _answers(self, pod: Obj) -> bool:
        app, cfg = _app(pod), self._cfg
        if app == "slurmctld":
            return self._table.alive(SLURMCTLD) and daemons.port_open(cfg.slurmctld_port)
        if app == "slurmdbd":
            return self._table.alive(SLURMDBD) and daemons.port_open(cfg.slurmdbd_port)
        if app == "login":
            return self._table.alive(LOGIN) and ssh_answers(cfg.login_port)
        name = pods.slurm_name(pod)
        port = self._slurm.declared().get(name)
        if port is None:
            return False
        return self._table.alive(f"slurmd-{name}") and daemons.port_open(port)

    def _report(self, live: list[Obj], ours: list[Obj]) -> None:
        with httpx.Client(
            base_url=self._cfg.k8s_url, timeout=TIMEOUT_S, verify=self._cfg.k8s_tls()
        ) as k8s:
            for pod in live:
                # Probed until Ready, then only its process is watched: each probe is an
                # empty connection Slurm logs as an error.
                was = _phase_ready(pod) == ("Running", True)
                ready = self._running(pod) if was else self._answers(pod)
                if _phase_ready(pod) != ("Running", ready) and (ready or _phase(pod) == "Running"):
                    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                    k8s.post(f"/_emulator/pods/{ns}/{name}/ready", json={"ready": ready})
            for pod in ours:
                if pods.terminating(pod):  # its daemon was stopped above: the deletion ends
                    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                    k8s.post(f"/_emulator/pods/{ns}/{name}/terminated")


def _app(pod: Obj) -> str:
    return str((pod["metadata"].get("labels") or {}).get(APP, ""))


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _phase_ready(pod: Obj) -> tuple[str, bool]:
    conds = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
    return _phase(pod), ready


def _partition(nodeset: Obj | None, default: str) -> str:
    """The partition a NodeSet's nodes are in: `PartitionName=` of its partition config."""
    config = str((((nodeset or {}).get("spec") or {}).get("partition") or {}).get("config") or "")
    found = re.search(r"PartitionName=(\S+)", config)
    return found.group(1) if found else default
