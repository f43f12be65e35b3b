"""The three PATCH flavours of the Kubernetes API, as the emulator applies them.

- JSON merge patch (RFC 7386): maps merge, `null` deletes, lists are replaced.
- JSON patch (RFC 6902): a list of add/remove/replace/move/copy/test operations.
- Strategic merge patch: a merge patch that also merges the lists the API declares with a
  `patchMergeKey` (node and pod `status.conditions` by `type`, containers by `name`, ...),
  and honours the `$patch`, `$retainKeys`, `$setElementOrder/` and
  `$deleteFromPrimitiveList/` directives. A list without a merge key (`spec.taints`) is
  replaced whole, as on a real API server.

Each function returns a new document and raises `PatchError` for a malformed patch; the
emulator answers that with the status code the API server would use.
"""

from __future__ import annotations

import copy
from typing import Any

Json = Any
Path = tuple[str, ...]

# Fields with a merge key in the Kubernetes OpenAPI (x-kubernetes-patch-merge-key), by the
# path of map keys leading to the list. Lists of scalars marked `merge` use the empty key.
_COMMON: dict[Path, str] = {
    ("metadata", "ownerReferences"): "uid",
    ("metadata", "finalizers"): "",
}
MERGE_KEYS: dict[str, dict[Path, str]] = {
    "nodes": {
        **_COMMON,
        ("status", "conditions"): "type",
        ("status", "addresses"): "type",
    },
    "pods": {
        **_COMMON,
        ("spec", "containers"): "name",
        ("spec", "initContainers"): "name",
        ("spec", "volumes"): "name",
        ("spec", "containers", "env"): "name",
        ("spec", "containers", "ports"): "containerPort",
        ("spec", "containers", "volumeMounts"): "mountPath",
        ("status", "conditions"): "type",
    },
    "poddisruptionbudgets": {**_COMMON, ("status", "conditions"): "type"},
    "namespaces": dict(_COMMON),
    "deployments": {
        **_COMMON,
        ("spec", "template", "spec", "containers"): "name",
        ("spec", "template", "spec", "initContainers"): "name",
        ("spec", "template", "spec", "volumes"): "name",
        ("spec", "template", "spec", "containers", "env"): "name",
        ("spec", "template", "spec", "containers", "ports"): "containerPort",
        ("spec", "template", "spec", "containers", "volumeMounts"): "mountPath",
        ("status", "conditions"): "type",
    },
}
# A DaemonSet's template merges as a Deployment's does.
MERGE_KEYS["daemonsets"] = MERGE_KEYS["deployments"]


class PatchError(ValueError):
    """The patch cannot be applied; `status` is the HTTP status the API server would answer."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Json, patch: Json) -> Json:
    """RFC 7386: the patch is the new document, except that maps merge and null deletes."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge(target: Json, patch: Json, keys: dict[Path, str]) -> Json:
    if not isinstance(patch, dict):
        raise PatchError("strategic merge patch must be a JSON object", status=400)
    return _merge_map(copy.deepcopy(target) if isinstance(target, dict) else {}, patch, (), keys)


def _merge_map(out: dict[str, Json], patch: dict[str, Json], path: Path, keys: dict[Path, str]):
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive is not None:
        raise PatchError(f"unknown patch type: {directive!r} in map")
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [v for v in out[field] if v not in value]
            continue
        if value is None:
            out.pop(key, None)
            continue
        sub = path + (key,)
        old = out.get(key)
        if isinstance(value, dict):
            merged = _merge_map(
                copy.deepcopy(old) if isinstance(old, dict) else {}, value, sub, keys
            )
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list) and sub in keys:
            out[key] = _merge_list(old if isinstance(old, list) else [], value, sub, keys)
        else:
            out[key] = copy.deepcopy(value)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(old: list[Json], patch: list[Json], path: Path, keys: dict[Path, str]):
    merge_key = keys[path]
    if not merge_key:  # a set of scalars, such as finalizers
        return list(old) + [v for v in patch if v not in old]
    if any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = copy.deepcopy(old)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(f"map in list {'.'.join(path)} is missing its merge key {merge_key}")
        at = next((i for i, o in enumerate(out) if o.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
            continue
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = _merge_map(out[at], item, path, keys)
    return out


def json_patch(target: Json, ops: Json) -> Json:
    if not isinstance(ops, list):
        raise PatchError("json patch must be a list of operations", status=400)
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed json patch operation {op!r}", status=400)
        doc = _apply_op(doc, op)
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"json pointer {path!r} must start with /", status=400)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Json, parts: list[str], path: str) -> Json:
    node = doc
    for part in parts[:-1]:
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise PatchError(f"path {path} does not exist") from None
    return node


def _get(doc: Json, path: str) -> Json:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    try:
        return parent[int(parts[-1])] if isinstance(parent, list) else parent[parts[-1]]
    except (KeyError, IndexError, ValueError, TypeError):
        raise PatchError(f"path {path} does not exist") from None


def _remove(doc: Json, path: str) -> Json:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    value = _get(doc, path)
    if isinstance(parent, list):
        parent.pop(int(parts[-1]))
    else:
        del parent[parts[-1]]
    return value


def _add(doc: Json, path: str, value: Json, *, replace: bool) -> Json:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
            return doc
        try:
            index = int(last)
        except ValueError:
            raise PatchError(f"bad list index in {path}") from None
        if not 0 <= index <= len(parent) - (1 if replace else 0):
            raise PatchError(f"index out of range in {path}")
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace operation does not apply: doc is missing key {path}")
        parent[last] = value
    else:
        raise PatchError(f"path {path} does not exist")
    return doc


def _apply_op(doc: Json, op: dict[str, Json]) -> Json:
    kind, path = op["op"], op["path"]
    if kind in ("add", "replace", "test") and "value" not in op:
        raise PatchError(f"{kind} operation needs a value", status=400)
    if kind == "add":
        return _add(doc, path, copy.deepcopy(op["value"]), replace=False)
    if kind == "replace":
        return _add(doc, path, copy.deepcopy(op["value"]), replace=True)
    if kind == "remove":
        _remove(doc, path)
        return doc
    if kind == "test":
        if _get(doc, path) != op["value"]:
            raise PatchError(f"testing value {path} failed")
        return doc
    if kind in ("move", "copy"):
        source = op.get("from")
        if not isinstance(source, str):
            raise PatchError(f"{kind} operation needs from", status=400)
        value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
        return _add(doc, path, value, replace=False)
    raise PatchError(f"unexpected json patch operation {kind!r}", status=400)
