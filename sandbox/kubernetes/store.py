"""The emulated cluster's objects, kept by the rules the API server enforces.

Objects get a uid, a creationTimestamp and a resourceVersion from one cluster-wide counter,
bumped on every write. A stale resourceVersion on an update or patch is a 409 Conflict; status
changes only through the status subresource; a pod is created Pending; deleting a bound pod
is graceful; Slinky's custom resources are pruned and validated against their published CRD
schemas on every create, update and patch (`sandbox.kubernetes.crd_schema`). The other components
of a cluster act inside the same write, so tests never race them (`sandbox.kubernetes.controllers`
holds what they do):

- a kubelet on every Ready node starts bound pods at once and finishes their graceful
  deletion at once; a NotReady node's kubelet does nothing, so its pods stay Terminating
  until force-deleted (grace 0), as on a real cluster;
- the node lifecycle controller keeps its NoSchedule taints in line with the node and marks
  a NotReady node's pods not Ready;
- pod garbage collection removes the pods of a deleted Node;
- PodDisruptionBudget status is computed on every read from the matching pods (expected =
  those pods, or their NodeSet owner's replicas when larger);
- the Deployment controller keeps each Deployment's pods at `spec.replicas` and its status
  current (`sandbox.kubernetes.deployments`), and the scheduler binds pods with no node
  (`sandbox.kubernetes.scheduler`), after every write: a node relabelled, untainted or uncordoned
  takes a pending pod in the same request;
- pods matching `external_kubelet` (a label selector) are left to a kubelet outside the
  emulator (the sandbox's inference kubelet): bound, they stay Pending until it reports
  them ready, and deleted gracefully they stay Terminating until it reports them gone.

`--state FILE` keeps the objects in a JSON file, rewritten after every change.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from autoclusters.sandbox.kubernetes import controllers, crd_schema, daemonsets, deployments
from autoclusters.sandbox.kubernetes import (
    patch as k8s_patch,
)
from autoclusters.sandbox.kubernetes import (
    scale as k8s_scale,
)
from autoclusters.sandbox.kubernetes import (
    scheduler as k8s_scheduler,
)
from autoclusters.sandbox.kubernetes.controllers import TERMINAL, is_ready
from autoclusters.sandbox.kubernetes.crd_schema import FieldValidation
from autoclusters.sandbox.kubernetes.objects import (
    DAEMONSETS,
    DEPLOYMENTS,
    EVENTS,
    KINDS,
    NAMESPACES,
    NODES,
    PDBS,
    PODS,
    ApiError,
    Kind,
    Obj,
    already_exists,
    bad_request,
    conflict,
    fields_match,
    invalid,
    labels_match,
    new_uid,
    not_found,
    now,
    parse_field_selector,
    parse_label_selector,
    selector_requirements,
    validate_deployment,
    validate_meta,
    validate_node,
    validate_pdb,
    validate_pod,
)
from autoclusters.sandbox.kubernetes.watch import Event, Hub, Subscription

_SMP = "application/strategic-merge-patch+json"
_MERGE = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"
Key = tuple[str, str]


class Store:
    def __init__(
        self, state_file: Path | None = None, *, kubelet: bool = True, external_kubelet: str = ""
    ) -> None:
        self._lock = threading.RLock()
        self._file = state_file
        self._kubelet_on = kubelet
        # Pods matching this label selector are run by a kubelet outside the emulator (the
        # sandbox's inference kubelet): the emulator neither starts them nor finishes their
        # deletion; that kubelet reports both through the admin API.
        self._external = parse_label_selector(external_kubelet) if external_kubelet else None
        # Creation order by uid (a scale-down removes the newest first; timestamps are seconds).
        self._born: dict[str, int] = {}
        self._rv = 0
        self._objs: dict[str, dict[Key, Obj]] = {r: {} for r in KINDS}
        # Pods whose readiness probe fails: the kubelet runs them but never reports them Ready.
        self._unready: set[Key] = set()
        self._hub = Hub()
        if state_file is not None and state_file.exists():
            saved = json.loads(state_file.read_text())
            self._rv = saved["rv"]
            for resource, items in saved["objects"].items():
                for o in items:
                    self._objs[resource][self._key(KINDS[resource], o)] = o
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            if ("", ns) not in self._objs["namespaces"]:
                self.create(NAMESPACES, None, {"metadata": {"name": ns}})

    # -- reads ----------------------------------------------------------------------------

    def get(self, kind: Kind, ns: str | None, name: str) -> Obj:
        with self._lock:
            return self._out(kind, self._find(kind, ns, name))

    def list_objects(
        self, kind: Kind, ns: str | None, label_selector: str, field_selector: str
    ) -> Obj:
        lreqs = parse_label_selector(label_selector)
        freqs = parse_field_selector(kind, field_selector)
        with self._lock:
            items = [
                self._out(kind, o, item=True)
                for (ons, _), o in sorted(self._objs[kind.resource].items())
                if (ns is None or ons == ns)
                and labels_match(o["metadata"].get("labels") or {}, lreqs)
                and fields_match(o, freqs)
            ]
            return {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def matcher(
        self, kind: Kind, ns: str | None, label_selector: str, field_selector: str
    ) -> Callable[[Obj], bool]:
        """What a list or watch with these selectors keeps (a 400 for a bad selector)."""
        lreqs = parse_label_selector(label_selector)
        freqs = parse_field_selector(kind, field_selector)

        def keep(o: Obj) -> bool:
            meta = o["metadata"]
            return (
                (ns is None or (meta.get("namespace") or "") == ns)
                and labels_match(meta.get("labels") or {}, lreqs)
                and fields_match(o, freqs)
            )

        return keep

    def watch(
        self, kind: Kind, resource_version: str, loop: asyncio.AbstractEventLoop
    ) -> tuple[list[Event], Subscription]:
        """A watch from `resource_version`: with none (or "0"), every current object as
        ADDED first, as the API server sends; then each change (`watch`)."""
        with self._lock:
            if resource_version in ("", "0"):
                initial = [
                    Event(self._rv, "ADDED", kind, self._out(kind, o))
                    for _, o in sorted(self._objs[kind.resource].items())
                ]
                return initial, self._hub.subscribe(kind, self._rv, loop)
            try:
                since = int(resource_version)
            except ValueError:
                raise bad_request(f"invalid resource version: {resource_version!r}") from None
            return [], self._hub.subscribe(kind, since, loop)

    def close_watches(self) -> None:
        with self._lock:
            self._hub.close_all()

    def unwatch(self, sub: Subscription) -> None:
        with self._lock:
            self._hub.unsubscribe(sub)

    def dump(self) -> Obj:
        with self._lock:
            return {
                r: [self._out(KINDS[r], o) for o in objs.values()] for r, objs in self._objs.items()
            }

    # -- writes ---------------------------------------------------------------------------

    def create(
        self, kind: Kind, ns: str | None, body: Any, fields: FieldValidation | None = None
    ) -> Obj:
        """`fields`: the request's `?fieldValidation=` (custom resources with a published
        schema: `crd_schema`), and where its warnings go."""
        with self._lock:
            out = self._create(kind, ns, body, fields)
            self._settle()
            return out

    def _create(
        self, kind: Kind, ns: str | None, body: Any, fields: FieldValidation | None = None
    ) -> Obj:
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {kind.kind} create must be a JSON object")
        self._check_type(kind, body)
        obj = copy.deepcopy(body)
        # As the API server's decoder: unknown fields pruned (or refused: Strict).
        crd_schema.decode(kind, obj, "create", fields)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on "
                    "the request"
                )
            meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            meta["name"] = meta["generateName"] + suffix
        with self._lock:
            validate_meta(kind, obj)
            if kind.namespaced and ("", ns) not in self._objs["namespaces"]:
                raise not_found(NAMESPACES, ns or "")
            crd_schema.validate(kind, obj)
            if self._key(kind, obj) in self._objs[kind.resource]:
                raise already_exists(kind, meta["name"])
            for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(k, None)
            meta.update(uid=new_uid(), creationTimestamp=now())
            self._born[meta["uid"]] = len(self._born) + 1
            self._defaults(kind, obj)
            self._commit(kind, obj, None)
            out = self._out(kind, obj)
            if kind is PODS and obj["spec"].get("nodeName"):
                self._kubelet(obj["spec"]["nodeName"])
            return out

    def replace(
        self,
        kind: Kind,
        ns: str | None,
        name: str,
        body: Any,
        sub: str | None,
        fields: FieldValidation | None = None,
    ) -> Obj:
        with self._lock:
            old = self._find(kind, ns, name)
            out = self._update(kind, old, body, sub, "update", fields)
            self._settle()
            return out

    def patch(
        self,
        kind: Kind,
        ns: str | None,
        name: str,
        content_type: str,
        body: Any,
        sub: str | None,
        fields: FieldValidation | None = None,
    ) -> Obj:
        ctype = content_type.split(";")[0].strip().lower()
        accepted = [_JSON_PATCH, _MERGE] if kind.custom else [_JSON_PATCH, _MERGE, _SMP]
        if ctype not in accepted:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(accepted)}",
            )
        with self._lock:
            old = self._find(kind, ns, name)
            doc = self._out(kind, old)
            try:
                if ctype == _SMP:
                    new = k8s_patch.strategic_merge(
                        doc, body, k8s_patch.MERGE_KEYS.get(kind.resource, {})
                    )
                elif ctype == _MERGE:
                    if not isinstance(body, dict):
                        raise k8s_patch.PatchError("merge patch must be a JSON object", 400)
                    new = k8s_patch.merge_patch(doc, body)
                else:
                    new = k8s_patch.json_patch(doc, body)
            except k8s_patch.PatchError as e:
                if e.status == 400:
                    raise bad_request(str(e)) from None
                raise ApiError(422, "Invalid", str(e)) from None
            out = self._update(kind, old, new, sub, "patch", fields)
            self._settle()
            return out

    def delete(self, kind: Kind, ns: str | None, name: str, options: Obj, grace: int | None) -> Obj:
        with self._lock:
            old = self._find(kind, ns, name)
            _check_preconditions(kind, old, options.get("preconditions") or {})
            meta = old["metadata"]
            if options.get("gracePeriodSeconds") is not None:
                grace = int(options["gracePeriodSeconds"])
            if kind is PODS:
                out = self._delete_pod(old, grace)
                self._settle()
                return out
            self._remove(kind, self._key(kind, old))
            if kind is DEPLOYMENTS:  # the garbage collector: its pods go (gracefully)
                for pod in list(self._objs["pods"].values()):
                    if deployments.owned_by(pod, old) and not pod["metadata"].get(
                        "deletionTimestamp"
                    ):
                        self._delete_pod(pod, None)
            if kind is DAEMONSETS:
                for pod in list(self._objs["pods"].values()):
                    if daemonsets.owned_by(pod, old) and not pod["metadata"].get(
                        "deletionTimestamp"
                    ):
                        self._delete_pod(pod, None)
            if kind is NODES:
                self._collect_pods(name)
            if kind is NAMESPACES:
                for k in KINDS.values():
                    for key in [
                        key for key in self._objs[k.resource] if k.namespaced and key[0] == name
                    ]:
                        self._remove(k, key)
            self._settle()
            details = {"name": name, "kind": kind.resource, "uid": meta["uid"]}
            if kind.group:
                details["group"] = kind.group
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": details}  # fmt: skip

    def evict(self, ns: str, name: str, body: Any) -> Obj:
        """The eviction subresource: delete the pod unless a PodDisruptionBudget forbids it."""
        if not isinstance(body, dict):
            raise bad_request("the body of an eviction must be a JSON object")
        if (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise bad_request("name in URL does not match name in Eviction object")
        with self._lock:
            pod = self._find(PODS, ns, name)
            opts = body.get("deleteOptions") or {}
            _check_preconditions(PODS, pod, opts.get("preconditions") or {})
            grace = opts.get("gracePeriodSeconds")
            phase = (pod.get("status") or {}).get("phase")
            exempt = phase in (*TERMINAL, "Pending") or pod["metadata"].get("deletionTimestamp")
            if not exempt:
                self._check_budget(pod)
            self._delete_pod(pod, None if grace is None else int(grace))
            self._settle()
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "code": 201}  # fmt: skip

    # -- the admin side: machines and probes ----------------------------------------------

    def put_machine(
        self,
        *,
        name: str,
        provider_id: str,
        boot_id: str,
        labels: dict[str, str],
        annotations: dict[str, str],
        ready: bool,
        register_labels: dict[str, str] | None = None,
        register_taints: list[Obj] | None = None,
        gpus: int | None = None,
    ) -> Obj:
        """A machine registers as node `name`.

        `register_labels` and `register_taints` are the kubelet's `--node-labels` and
        `--register-with-taints`: set when the Node is created, never on a later boot (a
        reboot keeps whatever the cluster changed since). `gpus` is what the device plugin
        advertises as `nvidia.com/gpu` (capacity and allocatable), on every boot.

        The same providerID is the same machine rebooted: the Node object stays (with its
        cordon, taints and labels) and reports the new bootID. A different providerID is a new
        machine: the old Node is deleted (its pods garbage-collected) and a fresh Node, with a
        new uid and none of the old marks, registers under the same name.
        """
        with self._lock:
            old = self._objs["nodes"].get(("", name))
            if old is not None and (old.get("spec") or {}).get("providerID", "") == provider_id:
                node = copy.deepcopy(old)
                node["metadata"].setdefault("labels", {}).update(labels)
                node["metadata"].setdefault("annotations", {}).update(annotations)
                node.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = boot_id
                if gpus is not None:
                    for field in ("capacity", "allocatable"):
                        node["status"].setdefault(field, {})[k8s_scheduler.GPU] = str(gpus)
                reason = "KubeletReady" if ready else "KubeletNotReady"
                controllers.set_ready(node, ready=ready, reason=reason)
                self._commit(NODES, node, old)
            else:
                if old is not None:
                    self._remove(NODES, ("", name))
                    self._collect_pods(name)
                self._create(
                    NODES,
                    None,
                    controllers.machine(
                        name,
                        provider_id=provider_id,
                        boot_id=boot_id,
                        labels={**(register_labels or {}), **labels},
                        annotations=annotations,
                        ready=ready,
                        taints=register_taints or [],
                        gpus=gpus,
                    ),
                )
            self._after_ready_change(name, ready=ready)
            self._settle()
            return self.get(NODES, None, name)

    def set_node_ready(self, name: str, *, ready: bool, reason: str, message: str) -> Obj:
        with self._lock:
            old = self._find(NODES, None, name)
            node = copy.deepcopy(old)
            reason = reason or ("KubeletReady" if ready else "KubeletNotReady")
            controllers.set_ready(node, ready=ready, reason=reason, message=message)
            self._commit(NODES, node, old)
            self._after_ready_change(name, ready=ready)
            self._settle()
            return self.get(NODES, None, name)

    def remove_machine(self, name: str) -> None:
        with self._lock:
            self._find(NODES, None, name)
            self._remove(NODES, ("", name))
            self._collect_pods(name)
            self._settle()

    def set_pod_ready(
        self,
        ns: str,
        name: str,
        *,
        ready: bool,
        container_id: str | None = None,
        restart_count: int | None = None,
    ) -> Obj:
        """The readiness probe's verdict. For a pod an external kubelet runs, the first
        report also starts it (Running): that kubelet has started its process; it may say
        which (`container_id`, the same for every container) and how often it restarted."""
        with self._lock:
            pod = self._find(PODS, ns, name)
            key = self._key(PODS, pod)
            (self._unready.discard if ready else self._unready.add)(key)
            phase = (pod.get("status") or {}).get("phase")
            starting = (
                phase == "Pending"
                and self._is_external(pod)
                and pod["spec"].get("nodeName")
                and not pod["metadata"].get("deletionTimestamp")
            )
            node = self._objs["nodes"].get(("", pod["spec"].get("nodeName") or ""))
            # An external kubelet's word on a pod of a NotReady node is not taken: the node
            # lifecycle controller keeps such pods not Ready.
            down = self._is_external(pod) and (node is None or not is_ready(node))
            if (phase == "Running" or starting) and not (ready and down):
                self._set_pod_status(pod, ready=ready, container_id=container_id,
                                     restart_count=restart_count)  # fmt: skip
            self._settle()
            return self.get(PODS, ns, name)

    def finish_pod(self, ns: str, name: str) -> Obj:
        """An external kubelet reports a terminating pod's containers gone: the deletion
        completes (the pod object goes). A pod not being deleted is a 409."""
        with self._lock:
            pod = self._find(PODS, ns, name)
            if not pod["metadata"].get("deletionTimestamp"):
                raise conflict(PODS, name, "the pod is not being deleted")
            self._remove(PODS, self._key(PODS, pod))
            self._settle()
            return self._out(PODS, pod)

    # -- the scale subresource (apps/v1 Deployments) ---------------------------------------

    def get_scale(self, kind: Kind, ns: str, name: str) -> Obj:
        with self._lock:
            return k8s_scale.scale(kind, self._find(kind, ns, name))

    def replace_scale(self, kind: Kind, ns: str, name: str, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of a Scale update must be a JSON object")
        with self._lock:
            old = self._find(kind, ns, name)
            meta = body.get("metadata") or {}
            if meta.get("name") not in (None, "", name):
                raise bad_request("the name of the object does not match the name on the URL")
            rv = meta.get("resourceVersion")
            if rv and rv != old["metadata"]["resourceVersion"]:
                raise conflict(kind, name)
            replicas = (body.get("spec") or {}).get("replicas", 0)
            if isinstance(replicas, bool) or not isinstance(replicas, int):
                raise bad_request("json: cannot unmarshal spec.replicas into Go type int32")
            if replicas < 0:
                raise invalid(
                    kind,
                    name,
                    "spec.replicas",
                    f"Invalid value: {replicas}: must be greater than or equal to 0",
                )
            new = k8s_scale.scaled(kind, old, replicas)
            if kind.custom:
                crd_schema.validate(kind, new)
            self._commit(kind, new, old)
            self._settle()
            return k8s_scale.scale(kind, self._find(kind, ns, name))

    def patch_scale(self, kind: Kind, ns: str, name: str, content_type: str, body: Any) -> Obj:
        ctype = content_type.split(";")[0].strip().lower()
        if ctype not in (_JSON_PATCH, _MERGE, _SMP):
            raise ApiError(415, "UnsupportedMediaType", f"unsupported media type {ctype}")
        with self._lock:
            doc = k8s_scale.scale(kind, self._find(kind, ns, name))
            try:
                if ctype == _SMP:
                    new = k8s_patch.strategic_merge(doc, body, {})
                elif ctype == _MERGE:
                    if not isinstance(body, dict):
                        raise k8s_patch.PatchError("merge patch must be a JSON object", 400)
                    new = k8s_patch.merge_patch(doc, body)
                else:
                    new = k8s_patch.json_patch(doc, body)
            except k8s_patch.PatchError as e:
                if e.status == 400:
                    raise bad_request(str(e)) from None
                raise ApiError(422, "Invalid", str(e)) from None
            if (new.get("metadata") or {}).get("resourceVersion") == doc["metadata"].get(
                "resourceVersion"
            ):
                new["metadata"].pop("resourceVersion", None)  # a patch needs no precondition
            return self.replace_scale(kind, ns, name, new)

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _key(kind: Kind, obj: Obj) -> Key:
        meta = obj["metadata"]
        return (meta.get("namespace") or "" if kind.namespaced else "", meta["name"])

    def _find(self, kind: Kind, ns: str | None, name: str) -> Obj:
        obj = self._objs[kind.resource].get((ns or "" if kind.namespaced else "", name))
        if obj is None:
            raise not_found(kind, name)
        return obj

    def _check_type(self, kind: Kind, body: Obj) -> None:
        for field, want in (("apiVersion", kind.api_version), ("kind", kind.kind)):
            got = body.get(field)
            if got is None and kind.custom:
                raise bad_request(f"Object '{field[0].upper() + field[1:]}' is missing in body")
            if got is not None and got != want:
                raise bad_request(
                    f"the {field} in the data ({got}) does not match the expected {field} ({want})"
                )

    def _defaults(self, kind: Kind, obj: Obj) -> None:
        if kind is PODS:
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif kind is PDBS:
            obj.pop("status", None)
        elif kind is NAMESPACES:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        elif kind is DEPLOYMENTS:
            deployments.defaults(obj)
            obj["status"] = {}
        elif kind is DAEMONSETS:
            daemonsets.defaults(obj)
            obj["status"] = daemonsets.empty_status()

    def _update(
        self,
        kind: Kind,
        old: Obj,
        body: Any,
        sub: str | None,
        verb: str = "update",
        fields: FieldValidation | None = None,
    ) -> Obj:
        """`body` is the new object (a PUT's, or a patch's result: `verb`)."""
        if not isinstance(body, dict):
            raise bad_request(f"the body of a {kind.kind} update must be a JSON object")
        self._check_type(kind, body)
        crd_schema.decode(kind, body, verb, fields)
        ometa, name = old["metadata"], old["metadata"]["name"]
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, "", name):
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        if kind.namespaced and meta.get("namespace") not in (None, "", ometa["namespace"]):
            raise bad_request("the namespace of the provided object does not match the namespace")
        rv = meta.get("resourceVersion")
        if rv and rv != ometa["resourceVersion"]:
            raise conflict(kind, name)
        if not rv and kind.custom:
            raise invalid(
                kind,
                name,
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )
        if meta.get("uid") and meta["uid"] != ometa["uid"]:
            raise conflict(kind, name, f"Precondition failed: UID in precondition: {ometa['uid']}, "
                           f"UID in object meta: {meta['uid']}")  # fmt: skip
        if sub == "status":
            new = {**copy.deepcopy(old), "status": copy.deepcopy(body.get("status"))}
        else:
            new = copy.deepcopy(body)
            new["metadata"] = {**copy.deepcopy(meta)}
            for k in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion",
                      "generation", "deletionTimestamp", "deletionGracePeriodSeconds"):  # fmt: skip
                if k in ometa:
                    new["metadata"][k] = ometa[k]
            if kind.status_subresource:
                new["status"] = copy.deepcopy(old.get("status"))
        new.pop("kind", None)
        new.pop("apiVersion", None)
        if new.get("status") is None:
            new.pop("status", None)
        validate_meta(kind, new)
        crd_schema.validate(kind, new)
        self._commit(kind, new, old)
        return self._out(kind, new)

    def _commit(self, kind: Kind, obj: Obj, old: Obj | None, *, binding: bool = False) -> None:
        if kind is NODES:
            controllers.lifecycle_taints(obj)
            validate_node(obj, old)
        elif kind is PODS:
            validate_pod(obj, None if binding else old)  # the binding sets spec.nodeName
        elif kind is PDBS:
            validate_pdb(obj)
        elif kind is DEPLOYMENTS:
            validate_deployment(obj)
        if kind in (PODS, PDBS, DEPLOYMENTS, DAEMONSETS) or kind.custom:
            gen = (old or {}).get("metadata", {}).get("generation", 0)
            changed = old is None or old.get("spec") != obj.get("spec")
            obj["metadata"]["generation"] = gen + 1 if changed else gen
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._objs[kind.resource][self._key(kind, obj)] = obj
        self._hub.publish(
            Event(self._rv, "ADDED" if old is None else "MODIFIED", kind, self._out(kind, obj))
        )
        self._save()

    def _remove(self, kind: Kind, key: Key) -> None:
        gone = self._objs[kind.resource].pop(key, None)
        if kind is PODS:
            self._unready.discard(key)
        self._rv += 1
        if gone is not None:
            # The API server's DELETED event carries the object at the deletion's version.
            last = self._out(kind, gone)
            last["metadata"]["resourceVersion"] = str(self._rv)
            self._hub.publish(Event(self._rv, "DELETED", kind, last))
        self._save()

    def _save(self) -> None:
        if self._file is None:
            return
        data = {"rv": self._rv, "objects": {r: list(o.values()) for r, o in self._objs.items()}}
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._file)

    def _out(self, kind: Kind, obj: Obj, *, item: bool = False) -> Obj:
        out = copy.deepcopy(obj)
        if not item or kind.custom:
            out = {"kind": kind.kind, "apiVersion": kind.api_version, **out}
        if kind is PDBS:
            out["status"] = self._pdb_status(obj)
        return out

    def _delete_pod(self, pod: Obj, grace: int | None) -> Obj:
        meta, spec = pod["metadata"], pod["spec"]
        if grace is None:
            grace = meta.get(
                "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
            )
        grace = max(int(grace or 0), 0)
        if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in TERMINAL:
            grace = 0
        if grace == 0:
            self._remove(PODS, self._key(PODS, pod))
            return self._out(PODS, pod)
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
            return self._out(PODS, pod)
        new = copy.deepcopy(pod)
        at = datetime.now(UTC) + timedelta(seconds=grace)
        new["metadata"]["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        self._commit(PODS, new, pod)
        out = self._out(PODS, new)
        self._kubelet(spec["nodeName"])
        return out

    def _collect_pods(self, node: str) -> None:
        for key, pod in list(self._objs["pods"].items()):
            if pod["spec"].get("nodeName") == node:
                self._remove(PODS, key)

    def _kubelet(self, node_name: str) -> None:
        node = self._objs["nodes"].get(("", node_name))
        if not self._kubelet_on or node is None or not is_ready(node):
            return
        for key, pod in list(self._objs["pods"].items()):
            if pod["spec"].get("nodeName") != node_name or self._is_external(pod):
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self._remove(PODS, key)
            elif (pod.get("status") or {}).get("phase") not in TERMINAL:
                self._set_pod_status(pod, ready=key not in self._unready)

    def _is_external(self, pod: Obj) -> bool:
        return self._external is not None and labels_match(
            pod["metadata"].get("labels") or {}, self._external
        )

    # -- controllers: the Deployment controller, the scheduler ------------------------------

    def _settle(self) -> None:
        """What the controllers do after a write: Deployments' pods created or removed, pending
        pods scheduled (a node that changed may now fit), Deployments' status updated."""
        for _ in range(10):
            if not (
                self._reconcile_deployments() | self._reconcile_daemonsets() | self._schedule()
            ):
                break
        self._deployment_statuses()
        self._daemonset_statuses()

    def _owned(self, deploy: Obj) -> list[Obj]:
        ns = deploy["metadata"]["namespace"]
        return [
            p
            for (pns, _), p in self._objs["pods"].items()
            if pns == ns and deployments.owned_by(p, deploy)
        ]

    def _reconcile_deployments(self) -> bool:
        changed = False
        for deploy in list(self._objs["deployments"].values()):
            live = deployments.active(self._owned(deploy))
            want = int(deploy["spec"].get("replicas", 1))
            ns = deploy["metadata"]["namespace"]
            for _ in range(want - len(live)):
                self._create(PODS, ns, deployments.new_pod(deploy))
                changed = True
            if len(live) > want:
                doomed = deployments.removal_order(live, self._born)[: len(live) - want]
                for pod in doomed:
                    self._delete_pod(pod, None)
                changed = True
        return changed

    def _daemon_pods(self, ds: Obj) -> list[Obj]:
        ns = ds["metadata"]["namespace"]
        return [
            p
            for (pns, _), p in self._objs["pods"].items()
            if pns == ns and daemonsets.owned_by(p, ds)
        ]

    def _reconcile_daemonsets(self) -> bool:
        """One pod per eligible Node (sandbox.kubernetes.daemonsets); a pod of an external
        kubelet starts when that kubelet says so."""
        changed = False
        nodes = [self._objs["nodes"][k] for k in sorted(self._objs["nodes"])]
        for ds in list(self._objs["daemonsets"].values()):
            create, delete = daemonsets.plan(ds, nodes, self._daemon_pods(ds))
            for node in create:
                self._create(PODS, ds["metadata"]["namespace"], daemonsets.new_pod(ds, node))
            for pod in delete:
                self._delete_pod(pod, None)
            changed |= bool(create or delete)
        return changed

    def _daemonset_statuses(self) -> None:
        nodes = list(self._objs["nodes"].values())
        for ds in list(self._objs["daemonsets"].values()):
            status = daemonsets.status(ds, nodes, self._daemon_pods(ds))
            if status != ds.get("status"):
                self._commit(DAEMONSETS, {**copy.deepcopy(ds), "status": status}, ds)

    def _schedule(self) -> bool:
        nodes = [self._objs["nodes"][k] for k in sorted(self._objs["nodes"])]
        pending = [
            p
            for p in self._objs["pods"].values()
            if not p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") == "Pending"
            and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"
        ]
        bound = False
        for pod in sorted(pending, key=lambda p: self._born.get(p["metadata"]["uid"], 0)):
            node, message = k8s_scheduler.place(pod, nodes, list(self._objs["pods"].values()))
            new = copy.deepcopy(pod)
            if node is None:
                new["status"] = k8s_scheduler.unschedulable(pod.get("status") or {}, message)
                if new != pod:
                    self._commit(PODS, new, pod)
                if k8s_scheduler.unschedulable_message(pod.get("status") or {}) != message:
                    self._record(k8s_scheduler.failed_scheduling(new, message))
                continue
            new["spec"]["nodeName"] = node
            new["status"] = k8s_scheduler.scheduled(pod.get("status") or {})
            self._commit(PODS, new, pod, binding=True)
            self._kubelet(node)
            bound = True
        return bound

    def _record(self, event: Obj) -> None:
        """An Event the API server's own controllers leave (the scheduler's); one already
        there (the same name) is kept."""
        try:
            self._create(EVENTS, event["metadata"]["namespace"], event)
        except ApiError as e:
            if e.code != 409:
                raise

    def _deployment_statuses(self) -> None:
        for deploy in list(self._objs["deployments"].values()):
            status = deployments.status(deploy, self._owned(deploy), deploy.get("status"))
            if status != deploy.get("status"):
                new = {**copy.deepcopy(deploy), "status": status}
                self._commit(DEPLOYMENTS, new, deploy)

    def _after_ready_change(self, node_name: str, *, ready: bool) -> None:
        if ready:
            self._kubelet(node_name)
            return
        # The node lifecycle controller marks a NotReady node's pods not Ready.
        for pod in list(self._objs["pods"].values()):
            if pod["spec"].get("nodeName") == node_name and pod["status"].get("phase") == "Running":
                self._set_pod_status(pod, ready=False)

    def _set_pod_status(
        self,
        pod: Obj,
        *,
        ready: bool,
        container_id: str | None = None,
        restart_count: int | None = None,
    ) -> None:
        new = copy.deepcopy(pod)
        new["status"] = controllers.running_status(pod, ready=ready)
        for c in new["status"]["containerStatuses"]:
            if container_id is not None:
                c["containerID"] = container_id
            if restart_count is not None:
                c["restartCount"] = restart_count
        if new != pod:
            self._commit(PODS, new, pod)

    def _pdbs_for(self, pod: Obj) -> list[Obj]:
        labels = pod["metadata"].get("labels") or {}
        ns = pod["metadata"]["namespace"]
        return [
            b
            for (bns, _), b in self._objs["poddisruptionbudgets"].items()
            if bns == ns
            and (b.get("spec") or {}).get("selector") is not None
            and labels_match(labels, selector_requirements(b["spec"]["selector"]))
        ]

    def _check_budget(self, pod: Obj) -> None:
        budgets = self._pdbs_for(pod)
        if len(budgets) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource "
                "does not support.",
            )
        if budgets:
            controllers.check_budget(budgets[0], self._pdb_status(budgets[0]), pod)

    def _pdb_status(self, pdb: Obj) -> Obj:
        selector = (pdb.get("spec") or {}).get("selector")
        pods = []
        if selector is not None:
            reqs = selector_requirements(selector)
            pods = [
                p
                for (pns, _), p in self._objs["pods"].items()
                if pns == pdb["metadata"]["namespace"]
                and labels_match(p["metadata"].get("labels") or {}, reqs)
                and (p.get("status") or {}).get("phase") not in TERMINAL
            ]
        return controllers.pdb_status(pdb, pods, self._owner_replicas(pods))

    def _owner_replicas(self, pods: list[Obj]) -> int:
        """Replicas of the NodeSets owning these pods: evicted pods still count as expected."""
        owners = {
            (p["metadata"]["namespace"], ref.get("name"))
            for p in pods
            for ref in p["metadata"].get("ownerReferences") or []
            if ref.get("kind") == "NodeSet" and ref.get("controller")
        }
        total = 0
        for key in owners:
            ns_obj = self._objs["nodesets"].get(key)
            total += int(((ns_obj or {}).get("spec") or {}).get("replicas", 0) or 0)
        return total


def _check_preconditions(kind: Kind, obj: Obj, pre: Obj) -> None:
    """DeleteOptions.preconditions: act only on the object instance the caller saw."""
    meta = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        if pre.get(field) and pre[field] != meta.get(field):
            raise conflict(
                kind,
                meta["name"],
                f"Precondition failed: {label} in precondition: {pre[field]}, {label} in object "
                f"meta: {meta.get(field)}",
            )
