"""An emulated Slinky NodeSet controller (SchedMD's slurm-operator), DaemonSet-like: a client
of the Kubernetes API and of Slurm, as the real operator is, so the sandbox's slurmd pods
follow the Nodes and a cordon reaches Slurm.

Each pass (`SlinkyOperator.reconcile_once`), for every NodeSet:
- each eligible Node (the NodeSet's `spec.template.spec.nodeSelector`, else every GPU node)
  gets one slurmd pod the NodeSet controls (`operator_pods.py`);
  `internal/controller/nodeset/nodeset_sync.go` `podsShouldBeOnNode`, `syncNodeSetPods`;
- a pod whose Node is gone is deleted and its Slurm node goes DOWN with
  `slurm-operator: Pod is terminating`, as the slurmd container's preStop hook does
  (`internal/builder/workerbuilder/worker_app.go`). A pod the API server already removed with
  its Node (the emulator collects them at once) is remembered from the previous pass;
- `spec.replicas` caps the pods (the real operator ignores it in DaemonSet mode; here it is
  the way to exercise a scale-in and a scale-out): a pod beyond it (the newest Nodes' first),
  or on a Node no longer eligible, is cordoned and its Slurm node drained, and the pod goes
  only once the node is not busy (`nodeset_sync.go` `processCondemned`, `slurmcontrol.go`
  `IsNodeDrained`). Unlike the real one, a drain set by someone else is kept as it is rather
  than overwritten. More replicas than eligible Nodes: a Pending pod per missing Node
  (`operator_pods.new_node_pod`), which the cluster autoscaler makes a Node for
  (`autoscaler.py`, on the CMK platform); the new Node gets its own pod, and a
  Pending pod no longer needed goes;
- syncCordon (`nodeset_sync.go` `syncCordon`, `syncPodUncordon`): a cordoned Node's pod gets
  `nodeset.slinky.slurm.net/pod-cordon=true` and its Slurm node is drained with
  `slurm-operator: <the Node's node-cordon-reason annotation>`, else
  `slurm-operator: Node (<node>) was cordoned, Pod (<ns>/<pod>) must be cordoned`; an
  uncordoned Node's pod loses the annotation and its Slurm node is undrained if the drain is
  the operator's. A node whose reason is someone else's, or DOWN / not responding, is skipped.

On the CMK platform (`--state-dir`) it also runs the operator's other controllers
(`operator_workloads.py`: Controller, Accounting and LoginSet into pods), the emulated
kubelet that runs the pods' containers as the real daemons (`kubelet.py`), and, after each
pass, the cluster autoscaler of the node pools (`autoscaler.py`).

When Slurm cannot be read the pass only creates missing pods (which never asks Slurm):
nothing is drained, undrained, marked DOWN or deleted, and the report says "unknown".

Run: `python -m autoclusters.sandbox.slinky.operator --kubeconfig F --slurm-conf F`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import autoscaler as slinky_autoscaler
from autoclusters.sandbox.slinky import operator_pods as pods
from autoclusters.sandbox.slinky import operator_slurm as slurm
from autoclusters.sandbox.slinky.autoscaler import NodePoolAutoscaler
from autoclusters.sandbox.slinky.kubelet import SlinkyKubelet
from autoclusters.sandbox.slinky.operator_slurm import OperatorSlurm, OperatorSlurmCli, SlurmView
from autoclusters.sandbox.slinky.operator_workloads import WORKLOADS, SlurmWorkloads

log = logging.getLogger(__name__)

Obj = dict[str, Any]
PodKey = tuple[str, str]  # (namespace, name)
REQUEST_TIMEOUT_S = 10


@dataclass
class Report:
    """What one pass did; pods as `ns/name`, Slurm nodes by name."""

    slurm: str = "ok"  # "unknown": Slurm could not be read, or went away during the pass
    slurm_error: str = ""
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    cordoned: list[str] = field(default_factory=list)
    uncordoned: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    undrained: list[str] = field(default_factory=list)
    downed: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # scale-ins whose node is still busy
    pending: list[str] = field(default_factory=list)  # pods waiting for a Node (scale-out)
    errors: list[str] = field(default_factory=list)
    workloads: list[str] = field(default_factory=list)  # Controller/Accounting/LoginSet pods
    kubelet: list[str] = field(default_factory=list)  # daemons started and stopped
    autoscaler: list[str] = field(default_factory=list)  # machines asked for and removed


def _key(pod: Obj) -> PodKey:
    return (pod["metadata"]["namespace"], pod["metadata"]["name"])


def _show(pod: Obj) -> str:
    return "/".join(_key(pod))


def _items(fn: Callable[..., Any], *args: Any) -> list[Obj]:
    """A list call's items as the API's own JSON (the client's models would turn every field
    optional, and a CRD's objects are plain JSON anyway)."""
    resp = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
    doc = json.loads(resp.data)
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list | None):
        raise ValueError(f"a list without items: {str(doc)[:200]}")  # unknown, not empty
    return list(doc.get("items") or [])


class SlinkyOperator:
    def __init__(
        self,
        api: client.ApiClient,
        slurm_client: OperatorSlurm,
        workloads: SlurmWorkloads | None = None,
        kubelet: SlinkyKubelet | None = None,
        autoscaler: NodePoolAutoscaler | None = None,
    ) -> None:
        self._workloads = workloads
        self._kubelet = kubelet
        self._autoscaler = autoscaler
        self._core = client.CoreV1Api(api)
        self._crs = client.CustomObjectsApi(api)
        self._slurm = slurm_client
        # The pods of the previous pass (key -> (Node, Slurm node)): one that vanished with
        # its Node since then still owes its preStop hook's DOWN.
        self._seen: dict[PodKey, tuple[str, str]] = {}
        # Slurm nodes whose pod went with its Node and that are not DOWN yet (Slurm away).
        self._owed_down: set[str] = set()

    async def reconcile_once(self) -> Report:
        report = Report()
        nodesets = _items(
            self._crs.list_cluster_custom_object, pods.GROUP, pods.VERSION, pods.NODESETS
        )
        every_pod = _items(self._core.list_pod_for_all_namespaces)
        if self._workloads is not None:
            objects = {
                w.kind: _items(self._crs.list_cluster_custom_object, pods.GROUP, pods.VERSION,
                               w.plural)
                for w in WORKLOADS
            }  # fmt: skip
            report.workloads = self._workloads.reconcile(
                {**objects, "NodeSet": nodesets}, every_pod
            )
        if self._kubelet is not None:
            # Before Slurm is read: the kubelet is what starts slurmctld.
            report.kubelet = await asyncio.to_thread(self._kubelet.sync_once)
        view = await SlurmView.read(self._slurm)
        # The Nodes (and pods) after Slurm: a Node uncordoned and then its Slurm node resumed
        # (the runbook's return to service) is never seen cordoned beside the resumed node,
        # which would drain it again. Read before Slurm, across the kubelet's pass (seconds
        # when slurmctld restarts), the Node could be that stale.
        nodes = {n["metadata"]["name"]: n for n in _items(self._core.list_node)}
        every_pod = _items(self._core.list_pod_for_all_namespaces)
        owned = {_key(p): p for ns in nodesets for p in every_pod if pods.owned_by(p, ns)}
        self._note_vanished(owned, nodes)
        await self._pay_owed_downs(view, report)
        for nodeset in nodesets:
            mine = [p for p in owned.values() if pods.owned_by(p, nodeset)]
            await self._sync_nodeset(nodeset, mine, nodes, view, report)
        # What exists after the pass (with the pods it created) is what the next one compares.
        after = _items(self._core.list_pod_for_all_namespaces)
        self._seen = {
            _key(p): (pods.node_of(p), pods.slurm_name(p))
            for p in after
            if any(pods.owned_by(p, ns) for ns in nodesets) and not pods.waiting_for_node(p)
        }
        if self._autoscaler is not None:
            report.autoscaler = await self._autoscaler.sync(nodesets, after, nodes)
        report.errors += view.refused
        if not view.known:
            report.slurm, report.slurm_error = "unknown", view.error
        return report

    def _note_vanished(self, owned: dict[PodKey, Obj], nodes: dict[str, Obj]) -> None:
        for key, (node, slurm_node) in self._seen.items():
            if key not in owned and node not in nodes:
                self._owed_down.add(slurm_node)

    async def _pay_owed_downs(self, view: SlurmView, report: Report) -> None:
        for name in sorted(self._owed_down):
            s = view.get(name)
            if view.known and (s is None or slurm.terminated(s)):
                self._owed_down.discard(name)  # nothing to mark: no such node, or done
            elif s is not None and await view.mark_down(name):
                self._owed_down.discard(name)
                report.downed.append(name)

    async def _sync_nodeset(
        self,
        nodeset: Obj,
        mine: list[Obj],
        nodes: dict[str, Obj],
        view: SlurmView,
        report: Report,
    ) -> None:
        waiting = [p for p in mine if pods.waiting_for_node(p)]
        by_node: dict[str, list[Obj]] = {}
        for p in mine:
            if p not in waiting:
                by_node.setdefault(pods.node_of(p), []).append(p)
        for node_name, here in by_node.items():
            if node_name not in nodes:
                for p in here:
                    await self._node_gone(p, view, report)
        selector, cap = pods.node_selector(nodeset), pods.replicas(nodeset)
        # Nodes that already run a pod first: a new Node never displaces a running pod; the
        # oldest Nodes first, so a scale-in takes the newest (a scaled-out one) first.
        candidates = sorted(
            (n for n in nodes.values() if pods.eligible(n, selector)),
            key=lambda n: (
                n["metadata"]["name"] not in by_node,
                n["metadata"].get("creationTimestamp") or "",
                n["metadata"]["name"],
            ),
        )
        keep = {n["metadata"]["name"] for n in (candidates if cap is None else candidates[:cap])}
        for name in sorted(keep - by_node.keys()):
            self._create(nodeset, nodes[name], report)
        missing = 0 if cap is None else max(cap - len(candidates), 0)
        self._sync_waiting(nodeset, waiting, missing, {_key(p)[1] for p in mine}, report)
        for node_name, here in sorted(by_node.items()):
            if node_name not in nodes:
                continue
            # A Node whose hostname override changed runs its slurmd under the new name: the
            # pod of the old name goes (its slurmd with it) and the next pass makes the new.
            want = pods.hostname_of(nodes[node_name])
            stale = [p for p in here if pods.slurm_name(p) != want]
            for p in stale:
                self._forget(pods.slurm_name(p))  # that Slurm node is not coming back
                self._delete(p, report)
            here = [p for p in here if p not in stale]
            if not here:
                continue
            # The pod under the expected name is the one; any other is a duplicate.
            here.sort(key=lambda p: p["metadata"]["name"] != pods.pod_name(node_name))
            for extra in here[1:]:
                self._delete(extra, report)
            if node_name in keep:
                await self._sync_cordon(here[0], nodes[node_name], view, report)
            else:
                await self._scale_in(here[0], view, report)

    def _sync_waiting(
        self, nodeset: Obj, waiting: list[Obj], missing: int, taken: set[str], report: Report
    ) -> None:
        """One Pending pod per missing Node: the oldest kept, those beyond go (scaled back,
        or a Node came and got its own pod), those lacking are made under a free name (a
        Pending pod the scheduler bound to a new, untainted Node keeps its name there)."""
        live = sorted(
            (p for p in waiting if not pods.terminating(p)),
            key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
        )
        for p in live[missing:]:
            self._delete(p, report)
        ns, name = nodeset["metadata"]["namespace"], nodeset["metadata"]["name"]
        report.pending += [f"{ns}/{p['metadata']['name']}" for p in live[:missing]]
        k = 0
        for _ in range(missing - len(live)):
            k = next(
                i for i in itertools.count(k + 1) if pods.new_node_pod_name(name, i) not in taken
            )
            self._create_pod(ns, pods.new_node_pod(nodeset, k), report)
            report.pending.append(f"{ns}/{pods.new_node_pod_name(name, k)}")

    async def _node_gone(self, pod: Obj, view: SlurmView, report: Report) -> None:
        """The pod's Node is gone: the preStop hook's DOWN, then the pod (kept while Slurm is
        unknown, so the DOWN is not lost)."""
        s = view.get(pods.slurm_name(pod))
        if not view.known:
            return
        if s is not None and not slurm.terminated(s):
            if not await view.mark_down(s.name):
                return
            report.downed.append(s.name)
        self._delete(pod, report)

    async def _scale_in(self, pod: Obj, view: SlurmView, report: Report) -> None:
        """A pod beyond the NodeSet's replicas: drain first, delete once not busy."""
        if pods.terminating(pod) or not view.known:
            return
        s = view.get(pods.slurm_name(pod))
        if s is not None:
            if not s.drained:  # a drain already there (anyone's) is kept as it is
                why = slurm.reason(f"Pod ({_show(pod)}) is pending termination for scale-in")
                if not await view.drain(s.name, why):
                    return
                report.drained.append(s.name)
            if not pods.cordoned(pod):
                self._annotate(pod, "true", report.cordoned, report)
            if slurm.busy(s):
                report.waiting.append(_show(pod))
                return
            if not slurm.terminated(s):
                if not await view.mark_down(s.name):
                    return
                report.downed.append(s.name)
        self._forget(pods.slurm_name(pod))  # scaled in: out of Slurm with its pod
        self._delete(pod, report)

    def _forget(self, slurm_node: str) -> None:
        """The kubelet stops declaring the Slurm node once its pod is gone (a pod that goes
        with its Node leaves its node declared, DOWN: slinky_kubelet.py)."""
        if self._kubelet is not None:
            self._kubelet.forget(slurm_node)

    async def _sync_cordon(self, pod: Obj, node: Obj, view: SlurmView, report: Report) -> None:
        if pods.terminating(pod) or not view.known:
            return
        s = view.get(pods.slurm_name(pod))
        if s is None or not slurm.ours(s) or slurm.unresponsive(s):
            return  # no Slurm node yet, someone else's drain, or Slurm's own DOWN
        if (node.get("spec") or {}).get("unschedulable"):
            if not s.drained:
                name, notes = node["metadata"]["name"], node["metadata"].get("annotations") or {}
                default = f"Node ({name}) was cordoned, Pod ({_show(pod)}) must be cordoned"
                text = notes.get(pods.NODE_CORDON_REASON) or default
                if not await view.drain(s.name, slurm.reason(text)):
                    return
                report.drained.append(s.name)
            if not pods.cordoned(pod):
                self._annotate(pod, "true", report.cordoned, report)
            return
        if slurm.drained_by_us(s):
            if not await view.resume(s.name):
                return
            report.undrained.append(s.name)
        if pods.cordoned(pod):
            self._annotate(pod, None, report.uncordoned, report)

    # -- Kubernetes writes: a refusal is reported, the next pass tries again ----------------

    def _create(self, nodeset: Obj, node: Obj, report: Report) -> None:
        body = pods.slurmd_pod(nodeset, node["metadata"]["name"], pods.hostname_of(node))
        self._create_pod(nodeset["metadata"]["namespace"], body, report)

    def _create_pod(self, ns: str, body: Obj, report: Report) -> None:
        try:
            self._core.create_namespaced_pod(ns, body)  # type: ignore[arg-type]  # JSON as it is
        except ApiException as e:
            report.errors.append(f"create pod {body['metadata']['name']}: {e.status} {e.reason}")
            return
        report.created.append(f"{ns}/{body['metadata']['name']}")

    def _delete(self, pod: Obj, report: Report) -> None:
        ns, name = _key(pod)
        try:
            # The hook has run (or had nothing to do): no grace period to wait out.
            self._core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                report.errors.append(f"delete pod {ns}/{name}: {e.status} {e.reason}")
                return
        report.deleted.append(f"{ns}/{name}")

    def _annotate(self, pod: Obj, value: str | None, done: list[str], report: Report) -> None:
        """Set (or, with None, remove: a merge patch's null) the pod-cordon annotation."""
        ns, name = _key(pod)
        patch = {"metadata": {"annotations": {pods.POD_CORDON: value}}}
        try:
            self._core.patch_namespaced_pod(name, ns, patch)
        except ApiException as e:
            report.errors.append(f"annotate pod {ns}/{name}: {e.status} {e.reason}")
            return
        done.append(f"{ns}/{name}")

    async def run(self, poll_s: float) -> None:
        """Reconcile every `poll_s` seconds, for ever; a failed pass is logged, not fatal."""
        while True:
            try:
                report = await self.reconcile_once()
            except Exception:  # the API server away, a bad object: the next pass retries
                log.exception("reconcile failed")
            else:
                if report.slurm != "ok":
                    log.warning("Slurm unknown: %s", report.slurm_error)
                for line in report.errors:
                    log.warning("%s", line)
                for line in report.workloads + report.kubelet + report.autoscaler:
                    log.info("%s", line)
            await asyncio.sleep(poll_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m autoclusters.sandbox.slinky.operator", description=__doc__
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--slurm-conf", type=Path, required=True)
    parser.add_argument("--slurm-bin", type=Path, help="where sinfo and scontrol are")
    parser.add_argument("--poll-s", type=float, default=2.0)
    parser.add_argument("--once", action="store_true", help="one pass, print its report")
    parser.add_argument(
        "--state-dir", type=Path, help="CMK platform: run the pods' daemons for this sandbox"
    )
    parser.add_argument("--system-node", default="", help="where the Slurm control pods run")
    parser.add_argument(
        "--max-pool-nodes", type=int, default=0,
        help="the cluster autoscaler grows a NodeSet's node group up to this many machines "
        "(0: no autoscaler); its cloud is the sandbox's (--state-dir or --cloud-state-dir)",
    )  # fmt: skip
    parser.add_argument(
        "--cloud-state-dir", type=Path, help="Managed Slurm: the sandbox the autoscaler is of"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the kubelet's status reports
    api = api_client(kubeconfig=args.kubeconfig)
    workloads = kubelet = autoscaler = None
    if args.state_dir is not None:
        workloads = SlurmWorkloads(api, args.system_node)
        kubelet = SlinkyKubelet(api, SandboxConfig.load(args.state_dir))
    if args.max_pool_nodes > 0:
        sandbox = args.state_dir or args.cloud_state_dir
        if sandbox is None:
            parser.error("--max-pool-nodes needs --state-dir or --cloud-state-dir")
        autoscaler = slinky_autoscaler.for_sandbox(
            api, SandboxConfig.load(sandbox), args.max_pool_nodes
        )
    # A slurmctld that is not up yet holds sinfo until its timeout: on the CMK platform that
    # would hold the kubelet's next pass too, so the wait is shorter there.
    slurm_cli = OperatorSlurmCli(
        args.slurm_conf, args.slurm_bin, timeout_s=30 if kubelet is None else 10
    )
    operator = SlinkyOperator(api, slurm_cli, workloads, kubelet, autoscaler)
    if args.once:
        print(asyncio.run(operator.reconcile_once()))
        return
    asyncio.run(operator.run(args.poll_s))


if __name__ == "__main__":
    main()
