"""The emulated Slinky operator's other controllers: a `Controller` becomes the pod of its
slurmctld, an `Accounting` the pod of its slurmdbd, a `LoginSet` the pod of its sshd; and a
pod whose Slinky owner is gone goes too (the garbage collector's part).

Sources (github SlinkyProject/slurm-operator, HEAD f2ed3fc): the Controller's StatefulSet
`<controller>-controller` (one replica: pod `<controller>-controller-0`,
`internal/builder/controllerbuilder`), the Accounting's `<accounting>-accounting`
(`internal/builder/accountingbuilder`), the LoginSet's Deployment of `replicas` login pods
(`internal/builder/loginbuilder`); the pods' `app.kubernetes.io/name` is the daemon's.

Differences, and why: the pods are made directly, not through a StatefulSet or Deployment
(the sandbox's emulator runs no StatefulSet controller), and a LoginSet gets one pod
whatever its `replicas` (the sandbox has one login port). The pods run on the CMK
cluster's system node (the CPU node a CMK cluster runs its control workloads on), and their
containers are run by the emulated kubelet (sandbox/slinky/kubelet.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from autoclusters.sandbox.slinky import operator_pods as pods

Obj = dict[str, Any]
APP = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
IMAGE_TAG = "25.05"


@dataclass(frozen=True)
class Workload:
    """A Slinky kind whose object runs one pod of one daemon."""

    plural: str
    kind: str
    app: str  # the pod's app.kubernetes.io/name: which daemon its container is
    suffix: str  # the pod is `<object name><suffix>`


CONTROLLER = Workload("controllers", "Controller", "slurmctld", "-controller-0")
ACCOUNTING = Workload("accountings", "Accounting", "slurmdbd", "-0")
LOGINSET = Workload("loginsets", "LoginSet", "login", "-0")
WORKLOADS = (CONTROLLER, ACCOUNTING, LOGINSET)
SLINKY_KINDS = {"Controller", "Accounting", "LoginSet", "NodeSet"}


def workload_pod(w: Workload, obj: Obj, node: str) -> Obj:
    meta = obj["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"] + w.suffix,
            "namespace": meta["namespace"],
            "labels": {APP: w.app, INSTANCE: meta["name"]},
            "ownerReferences": [
                {
                    "apiVersion": f"{pods.GROUP}/{pods.VERSION}",
                    "kind": w.kind,
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "hostname": meta["name"] + w.suffix,
            "containers": [{"name": w.app, "image": f"ghcr.io/slinkyproject/{w.app}:{IMAGE_TAG}"}],
        },
    }


def owner_of(pod: Obj) -> Obj | None:
    """The pod's Slinky controller reference, if it has one."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in SLINKY_KINDS:
            return dict(ref)
    return None


class SlurmWorkloads:
    """One pass: every Controller, Accounting and LoginSet has its pod on `system_node`;
    a pod whose Slinky owner (by uid) is gone is deleted."""

    def __init__(self, api: client.ApiClient, system_node: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node = system_node

    def reconcile(self, objects: dict[str, list[Obj]], every_pod: list[Obj]) -> list[str]:
        """`objects`: each Slinky kind's objects (by kind, NodeSets included). Returns what
        it did, one line each."""
        done: list[str] = []
        uids = {
            (o["metadata"]["namespace"], kind, o["metadata"]["name"]): o["metadata"].get("uid")
            for kind, objs in objects.items()
            for o in objs
        }
        existing = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in every_pod}
        for w in WORKLOADS:
            for obj in objects.get(w.kind, []):
                body = workload_pod(w, obj, self._node)
                key = (obj["metadata"]["namespace"], body["metadata"]["name"])
                if key in existing:
                    continue
                try:
                    self._core.create_namespaced_pod(key[0], body)  # type: ignore[arg-type]
                except ApiException as e:
                    if e.status != 409:
                        done.append(f"create pod {'/'.join(key)}: {e.status} {e.reason}")
                    continue
                done.append(f"created {'/'.join(key)}")
        for pod in every_pod:
            ref = owner_of(pod)
            if ref is None:
                continue
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            uid = uids.get((ns, ref["kind"], ref.get("name", "")), "missing")
            if uid == "missing" or (ref.get("uid") and uid and ref["uid"] != uid):
                try:
                    self._core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        done.append(f"delete pod {ns}/{name}: {e.status} {e.reason}")
                        continue
                done.append(f"deleted {ns}/{name} (its {ref['kind']} is gone)")
        return done
