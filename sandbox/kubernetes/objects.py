"""What the emulated Kubernetes API knows about its objects: kinds, errors, selectors, checks.

Errors are the API server's `Status` objects with the same `reason` and `code` (NotFound 404,
AlreadyExists/Conflict 409, Invalid 422, BadRequest 400, TooManyRequests 429, ...), so the
real client raises the same `ApiException` it would against a cluster. Validation covers
what the AutoClusters activities could get wrong: label syntax, taints unique by key and
effect, condition statuses, pod spec immutability, and decode errors for wrongly typed fields.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    resource: str
    kind: str
    api_version: str
    namespaced: bool
    # Built-in kinds keep status apart (written only through the status subresource).
    status_subresource: bool = True
    custom: bool = False

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def qualified(self) -> str:
        """How the API server names the resource in messages: `poddisruptionbudgets.policy`."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


NAMESPACES = Kind("namespaces", "Namespace", "v1", namespaced=False)
NODES = Kind("nodes", "Node", "v1", namespaced=False)
PODS = Kind("pods", "Pod", "v1", namespaced=True)
PDBS = Kind("poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", namespaced=True)
NODESETS = Kind(
    "nodesets",
    "NodeSet",
    "slinky.slurm.net/v1beta1",
    namespaced=True,
    status_subresource=False,
    custom=True,
)
CONFIGMAPS = Kind("configmaps", "ConfigMap", "v1", namespaced=True, status_subresource=False)
# The keys Slinky's CRs reference (`slurmKeyRef`, `jwtKeyRef`, ...): provider crusoe-cmk makes them.
SECRETS = Kind("secrets", "Secret", "v1", namespaced=True, status_subresource=False)
PVCS = Kind("persistentvolumeclaims", "PersistentVolumeClaim", "v1", namespaced=True)
DEPLOYMENTS = Kind("deployments", "Deployment", "apps/v1", namespaced=True)
# The agent ships as one (deploy/kubernetes/agent.yaml): one pod per GPU Node.
DAEMONSETS = Kind("daemonsets", "DaemonSet", "apps/v1", namespaced=True)
# Core events: `kubectl describe` lists them (nothing in the emulator records any yet).
EVENTS = Kind("events", "Event", "v1", namespaced=True, status_subresource=False)


def _custom(resource: str, kind: str, api_version: str) -> Kind:
    return Kind(resource, kind, api_version, namespaced=True, status_subresource=False, custom=True)


# The rest of Slinky's kinds and Crusoe's Slurm CRDs (crusoe.md §1.5, §3): stored as given,
# with no operator acting on them (the `crusoe-cmk` provider's tests read them back).
SLINKY_CONTROLLERS = _custom("controllers", "Controller", "slinky.slurm.net/v1beta1")
SLINKY_ACCOUNTINGS = _custom("accountings", "Accounting", "slinky.slurm.net/v1beta1")
SLINKY_LOGINSETS = _custom("loginsets", "LoginSet", "slinky.slurm.net/v1beta1")
CRUSOE_SLURMCLUSTERS = _custom("slurmclusters", "SlurmCluster", "slurm.crusoe.ai/v1alpha1")
CRUSOE_SLURMUSERS = _custom("slurmusers", "SlurmUser", "slurm.crusoe.ai/v1alpha1")
KINDS = {
    k.resource: k
    for k in (
        NAMESPACES,
        NODES,
        PODS,
        PDBS,
        NODESETS,
        CONFIGMAPS,
        SECRETS,
        PVCS,
        DEPLOYMENTS,
        DAEMONSETS,
        EVENTS,
        SLINKY_CONTROLLERS,
        SLINKY_ACCOUNTINGS,
        SLINKY_LOGINSETS,
        CRUSOE_SLURMCLUSTERS,
        CRUSOE_SLURMUSERS,
    )
}
BY_PATH = {(k.api_version, k.resource): k for k in KINDS.values()}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_uid() -> str:
    return str(uuid.uuid4())


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(kind: Kind, name: str) -> Obj:
    d: Obj = {"name": name, "kind": kind.resource}
    if kind.group:
        d["group"] = kind.group
    return d


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.qualified} "{name}" not found', _details(kind, name))


def already_exists(kind: Kind, name: str) -> ApiError:
    msg = f'{kind.qualified} "{name}" already exists'
    return ApiError(409, "AlreadyExists", msg, _details(kind, name))


def conflict(kind: Kind, name: str, why: str = "") -> ApiError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    msg = f'Operation cannot be fulfilled on {kind.qualified} "{name}": {why}'
    return ApiError(409, "Conflict", msg, _details(kind, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: Kind, name: str, field: str, message: str) -> ApiError:
    details = {
        **_details(kind, name),
        "kind": kind.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}],
    }
    msg = f'{kind.kind} "{name}" is invalid: {field}: {message}'
    return ApiError(422, "Invalid", msg, details)


# -- selectors ------------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SET_REQ = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)$")
_EQ_REQ = re.compile(r"^([^\s!=(),]+)\s*(==|!=|=)\s*([^\s!=(),]*)$")


def _split_top(text: str) -> list[str]:
    """Split at commas outside parentheses: `a in (x,y),b` is two requirements."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str) -> list[tuple[str, str, list[str]]]:
    """`key=v`, `key==v`, `key!=v`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`."""
    reqs: list[tuple[str, str, list[str]]] = []
    for part in _split_top(text or ""):
        if m := _SET_REQ.match(part):
            values = [v.strip() for v in m.group(3).split(",") if v.strip()]
            reqs.append((m.group(1), "In" if m.group(2) == "in" else "NotIn", values))
        elif m := _EQ_REQ.match(part):
            reqs.append((m.group(1), "NotIn" if m.group(2) == "!=" else "In", [m.group(3)]))
        elif part.startswith("!") and _label_key_ok(part[1:].strip()):
            reqs.append((part[1:].strip(), "DoesNotExist", []))
        elif _label_key_ok(part):
            reqs.append((part, "Exists", []))
        else:
            raise bad_request(f"unable to parse requirement: {part!r}")
    return reqs


def selector_requirements(selector: Obj) -> list[tuple[str, str, list[str]]]:
    """A `metav1.LabelSelector` (matchLabels + matchExpressions) as requirements."""
    reqs = [(k, "In", [v]) for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        reqs.append((e.get("key", ""), e.get("operator", ""), list(e.get("values") or [])))
    return reqs


def labels_match(labels: dict[str, str], reqs: list[tuple[str, str, list[str]]]) -> bool:
    for key, op, values in reqs:
        has = key in labels
        if op == "In" and not (has and labels[key] in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if op == "Exists" and not has:
            return False
        if op == "DoesNotExist" and has:
            return False
    return True


_FIELDS: dict[str, set[str]] = {
    "pods": {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    },
    "nodes": {"spec.unschedulable"},
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
}


def parse_field_selector(kind: Kind, text: str) -> list[tuple[str, bool, str]]:
    """(field, equal?, value) triples; fields outside the kind's index are refused, as upstream."""
    allowed = {"metadata.name", "metadata.namespace"} | _FIELDS.get(kind.resource, set())
    out = []
    for part in _split_top(text or ""):
        m = re.match(r"^([^!=]+?)\s*(==|!=|=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: {part!r}; can't understand {part!r}")
        field = m.group(1).strip()
        if field not in allowed:
            raise bad_request(f"field label not supported: {field}")
        out.append((field, m.group(2) != "!=", m.group(3).strip()))
    return out


def fields_match(obj: Obj, reqs: list[tuple[str, bool, str]]) -> bool:
    for field, equal, value in reqs:
        cur: Any = obj
        for part in field.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        text = (
            ""
            if cur is None
            else ("true" if cur is True else "false" if cur is False else str(cur))
        )
        if (text == value) != equal:
            return False
    return True


# -- validation -----------------------------------------------------------------------------


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _string_map(kind: Kind, name: str, where: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise bad_request(
            f"json: cannot unmarshal {where} of {kind.kind} {name!r} into Go value of type "
            "map[string]string"
        )


def validate_meta(kind: Kind, obj: Obj) -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise bad_request(f"{kind.kind} has no metadata object")
    name = meta.get("name") or ""
    if not name:
        raise invalid(kind, "", "metadata.name", "Required value: name or generateName is required")
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise invalid(
            kind,
            name,
            "metadata.name",
            f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
            "alphanumeric characters, '-' or '.'",
        )
    _string_map(kind, name, "metadata.labels", meta.get("labels"))
    _string_map(kind, name, "metadata.annotations", meta.get("annotations"))
    for key, value in (meta.get("labels") or {}).items():
        if not _label_key_ok(key):
            raise invalid(kind, name, "metadata.labels", f'Invalid value: "{key}": bad label key')
        if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            raise invalid(
                kind,
                name,
                "metadata.labels",
                f'Invalid value: "{value}": a valid label must be an empty string or consist of '
                "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                "alphanumeric character (at most 63)",
            )
    for key in meta.get("annotations") or {}:
        if not _label_key_ok(key):
            raise invalid(kind, name, "metadata.annotations", f'Invalid value: "{key}"')


_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
_COND_STATUS = {"True", "False", "Unknown"}


def _conditions(kind: Kind, name: str, conds: Any) -> None:
    if conds is None:
        return
    if not isinstance(conds, list):
        raise bad_request(f"json: cannot unmarshal status.conditions of {kind.kind} {name!r}")
    for i, c in enumerate(conds):
        if not isinstance(c, dict) or not c.get("type"):
            raise invalid(kind, name, f"status.conditions[{i}].type", "Required value")
        if c.get("status") not in _COND_STATUS:
            raise invalid(
                kind,
                name,
                f"status.conditions[{i}].status",
                f'Unsupported value: "{c.get("status")}": supported values: "False", "True", '
                '"Unknown"',
            )


def validate_node(obj: Obj, old: Obj | None) -> None:
    name = obj["metadata"]["name"]
    spec = obj.get("spec") or {}
    was = ((old or {}).get("spec") or {}).get("providerID")
    if was and spec.get("providerID") != was:
        raise invalid(
            NODES,
            name,
            "spec.providerID",
            'Forbidden: node updates may not change providerID except from "" to valid',
        )
    if "unschedulable" in spec and not isinstance(spec["unschedulable"], bool):
        raise bad_request("json: cannot unmarshal spec.unschedulable into Go value of type bool")
    taints = spec.get("taints") or []
    if not isinstance(taints, list):
        raise bad_request("json: cannot unmarshal spec.taints into Go value of type []v1.Taint")
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(taints):
        if not isinstance(t, dict) or not t.get("key") or not _label_key_ok(t["key"]):
            raise invalid(NODES, name, f"spec.taints[{i}].key", "Invalid value: a qualified name")
        if t.get("effect") not in _EFFECTS:
            raise invalid(
                NODES, name, f"spec.taints[{i}].effect", f'Unsupported value: "{t.get("effect")}"'
            )
        if t.get("value") and (len(t["value"]) > 63 or not _LABEL_NAME.match(t["value"])):
            raise invalid(NODES, name, f"spec.taints[{i}].value", f'Invalid value: "{t["value"]}"')
        pair = (t["key"], t["effect"])
        if pair in seen:
            raise invalid(
                NODES,
                name,
                "spec.taints",
                f'Duplicate value: "{t["key"]}": taints must be unique by key and effect pair',
            )
        seen.add(pair)
    _conditions(NODES, name, (obj.get("status") or {}).get("conditions"))


def validate_pod(obj: Obj, old: Obj | None) -> None:
    name = obj["metadata"]["name"]
    containers = (obj.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid(PODS, name, "spec.containers", "Required value")
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not c.get("name"):
            raise invalid(PODS, name, f"spec.containers[{i}].name", "Required value")
        if not c.get("image"):
            raise invalid(PODS, name, f"spec.containers[{i}].image", "Required value")
    _conditions(PODS, name, (obj.get("status") or {}).get("conditions"))
    if old is not None and _mutable_view(obj["spec"]) != _mutable_view(old["spec"]):
        raise invalid(
            PODS,
            name,
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
            " `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
            "tolerations) or `spec.terminationGracePeriodSeconds`",
        )


def _mutable_view(spec: Obj) -> Obj:
    """The pod spec without the few fields an update may change."""
    view = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
    view["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in spec["containers"]]
    return view


_POD_MUTABLE = {"activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"}


def validate_pdb(obj: Obj) -> None:
    spec = obj.get("spec") or {}
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        raise invalid(
            PDBS,
            obj["metadata"]["name"],
            "spec",
            "Invalid value: minAvailable and maxUnavailable cannot be both set",
        )


def validate_deployment(obj: Obj) -> None:
    """What the API server refuses in a Deployment: a selector its template does not match,
    negative or non-integer replicas, a template without containers."""
    name = obj["metadata"]["name"]
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise invalid(DEPLOYMENTS, name, "spec", "Required value")
    replicas = spec.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise bad_request("json: cannot unmarshal spec.replicas into Go value of type int32")
    if replicas < 0:
        raise invalid(
            DEPLOYMENTS,
            name,
            "spec.replicas",
            f"Invalid value: {replicas}: must be greater than or equal to 0",
        )
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        raise invalid(DEPLOYMENTS, name, "spec.selector", "Required value")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not labels_match(labels, selector_requirements(selector)):
        raise invalid(
            DEPLOYMENTS,
            name,
            "spec.template.metadata.labels",
            f"Invalid value: {labels!r}: `selector` does not match template `labels`",
        )
    containers = (template.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        raise invalid(DEPLOYMENTS, name, "spec.template.spec.containers", "Required value")
