"""Server-side printing: objects as `meta.k8s.io/v1` Tables, as `kubectl get` asks for them.

kubectl sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...,application/json`
and prints whatever columns the server returns (columns of priority 1 only with `-o wide`).
Nodes, pods, namespaces, events and CRDs get the real API server's columns; every other kind
the default `NAME AGE` that a custom resource without printer columns gets.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from autoclusters.sandbox.kubernetes.objects import Obj

TABLE_VERSIONS = {"v1": "meta.k8s.io/v1", "v1beta1": "meta.k8s.io/v1beta1"}


def wanted_table(accept: str) -> str | None:
    """The Table apiVersion the Accept header asks for first, or None for plain objects."""
    for part in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io":
            version = TABLE_VERSIONS.get(params.get("v", ""))
            if version:
                return version
        elif part.split(";")[0].strip() in ("application/json", "*/*") and "as" not in params:
            return None
    return None


def age(timestamp: str | None, now: datetime | None = None) -> str:
    """apimachinery's HumanDuration, to the precision kubectl shows: `45s`, `12m`, `3h`."""
    if not timestamp:
        return "<unknown>"
    try:  # RFC 3339, as `...Z` or with an offset (the Python client sends `+00:00`)
        then = datetime.fromisoformat(timestamp)
    except ValueError:
        return "<invalid>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    s = max(int(((now or datetime.now(UTC)) - then).total_seconds()), 0)
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    return f"{d}d{h % 24}h" if d < 8 and h % 24 else f"{d}d"


Column = tuple[str, str, int, str]  # name, type, priority, description
Cells = Callable[[Obj], list[Any]]


def _meta(o: Obj) -> Obj:
    return o.get("metadata") or {}


def _name(o: Obj) -> str:
    return str(_meta(o).get("name", ""))


def _age(o: Obj) -> str:
    return age(_meta(o).get("creationTimestamp"))


def _node_cells(o: Obj) -> list[Any]:
    status = o.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    state = {"True": "Ready", "False": "NotReady"}.get(ready or "", "Unknown")
    if (o.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        k.split("/", 1)[1] or "<none>"
        for k in (_meta(o).get("labels") or {})
        if k.startswith("node-role.kubernetes.io/")
    )
    info = status.get("nodeInfo") or {}
    addresses = status.get("addresses") or []

    def address(kind: str) -> str:
        return next((a["address"] for a in addresses if a.get("type") == kind), "<none>")

    return [
        _name(o),
        state,
        ",".join(roles) or "<none>",
        _age(o),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage", "<unknown>"),
        info.get("kernelVersion", "<unknown>"),
        info.get("containerRuntimeVersion", "<unknown>"),
    ]


def _pod_cells(o: Obj) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in statuses)
    reason = status.get("reason") or status.get("phase") or "Unknown"
    if _meta(o).get("deletionTimestamp"):
        reason = "Terminating"
    return [
        _name(o),
        f"{ready}/{len(spec.get('containers') or [])}",
        reason,
        restarts,
        _age(o),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def _event_cells(o: Obj) -> list[Any]:
    involved = o.get("involvedObject") or {}
    last = o.get("lastTimestamp") or o.get("eventTime") or _meta(o).get("creationTimestamp")
    return [
        age(last),
        o.get("type", ""),
        o.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        o.get("message", ""),
    ]


def _daemonset_cells(o: Obj) -> list[Any]:
    """The API server's DaemonSet columns (pkg/printers/internalversion printDaemonSet)."""
    status = o.get("status") or {}
    template = (o.get("spec") or {}).get("template") or {}
    pod_spec = template.get("spec") or {}
    selector = pod_spec.get("nodeSelector") or {}
    containers = pod_spec.get("containers") or []
    match = ((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return [
        _name(o),
        int(status.get("desiredNumberScheduled", 0)),
        int(status.get("currentNumberScheduled", 0)),
        int(status.get("numberReady", 0)),
        int(status.get("updatedNumberScheduled", 0)),
        int(status.get("numberAvailable", 0)),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or "<none>",
        _age(o),
        ",".join(str(c.get("name", "")) for c in containers),
        ",".join(str(c.get("image", "")) for c in containers),
        ",".join(f"{k}={v}" for k, v in sorted(match.items())) or "<none>",
    ]


_NAME: Column = ("Name", "string", 0, "Name must be unique within a namespace.")
_AGE: Column = ("Age", "string", 0, "CreationTimestamp is a timestamp representing the server "
                "time when this object was created.")  # fmt: skip
_PRINTERS: dict[str, tuple[list[Column], Cells]] = {
    "nodes": (
        [
            _NAME,
            ("Status", "string", 0, "The status of the node"),
            ("Roles", "string", 0, "The roles of the node"),
            _AGE,
            ("Version", "string", 0, "Kubelet Version reported by the node."),
            ("Internal-IP", "string", 1, "List of internal IPs for the node."),
            ("External-IP", "string", 1, "List of external IPs for the node."),
            ("OS-Image", "string", 1, "OS Image reported by the node."),
            ("Kernel-Version", "string", 1, "Kernel Version reported by the node."),
            ("Container-Runtime", "string", 1, "Container Runtime Version reported by the node."),
        ],
        _node_cells,
    ),
    "pods": (
        [
            _NAME,
            (
                "Ready",
                "string",
                0,
                "The aggregate readiness state of this pod for accepting traffic.",
            ),  # fmt: skip
            ("Status", "string", 0, "The aggregate status of the containers in this pod."),
            (
                "Restarts",
                "string",
                0,
                "The number of times the containers in this pod have been restarted.",
            ),  # fmt: skip
            _AGE,
            ("IP", "string", 1, "IP address allocated to the pod."),
            ("Node", "string", 1, "Name of the node the pod is assigned to."),
            ("Nominated Node", "string", 1, "Name of the node the pod is nominated to."),
            ("Readiness Gates", "string", 1, "Pod readiness gates."),
        ],
        _pod_cells,
    ),
    "namespaces": (
        [_NAME, ("Status", "string", 0, "The status of the namespace"), _AGE],
        lambda o: [_name(o), (o.get("status") or {}).get("phase", ""), _age(o)],
    ),
    "events": (
        [
            ("Last Seen", "string", 0, "Time since the event was last seen."),
            ("Type", "string", 0, "The type of the event."),
            ("Reason", "string", 0, "The reason of the event."),
            ("Object", "string", 0, "The object the event is about."),
            ("Message", "string", 0, "The message of the event."),
        ],
        _event_cells,
    ),
    "daemonsets": (
        [
            _NAME,
            ("Desired", "integer", 0, "The number of nodes that should run the daemon pod."),
            ("Current", "integer", 0, "The number of nodes running at least one daemon pod."),
            ("Ready", "integer", 0, "The number of nodes running a Ready daemon pod."),
            ("Up-to-date", "integer", 0, "The number of nodes running the updated pod."),
            ("Available", "integer", 0, "The number of nodes running an available pod."),
            ("Node Selector", "string", 0, "The node selector of the pod template."),
            _AGE,
            ("Containers", "string", 1, "Names of each container in the template."),
            ("Images", "string", 1, "Images referenced by each container in the template."),
            ("Selector", "string", 1, "Label selector for pods."),
        ],
        _daemonset_cells,
    ),
    "customresourcedefinitions": (
        [_NAME, ("Created At", "date", 0, "When the CRD was created.")],
        lambda o: [_name(o), _meta(o).get("creationTimestamp", "")],
    ),
}
_DEFAULT: tuple[list[Column], Cells] = ([_NAME, _AGE], lambda o: [_name(o), _age(o)])


def _row_object(o: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return o
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": _meta(o)}


def table(resource: str, doc: Obj, api_version: str, include: str = "Metadata") -> Obj:
    """`doc` (a list, or one object) as a Table; `include` is the `includeObject` parameter
    (kubectl needs each row's metadata for its NAMESPACE column)."""
    columns, cells = _PRINTERS.get(resource, _DEFAULT)
    items = doc["items"] if "items" in doc else [doc]
    rows = []
    for o in items:
        row: Obj = {"cells": cells(o)}
        obj = _row_object(o, include or "Metadata")
        if obj is not None:
            row["object"] = obj
        rows.append(row)
    meta = {"resourceVersion": _meta(doc).get("resourceVersion", "")}
    return {
        "kind": "Table",
        "apiVersion": api_version,
        "metadata": meta,
        "columnDefinitions": [
            {
                "name": n,
                "type": t,
                "format": "name" if c is _NAME else "",
                "description": d,
                "priority": p,
            }  # fmt: skip
            for c in columns
            for n, t, p, d in [c]
        ],
        "rows": rows,
    }
