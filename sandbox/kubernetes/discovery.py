"""API discovery for the emulator: what `kubectl` reads before any verb.

`/api` (APIVersions), `/apis` (APIGroupList), `/apis/{group}` (APIGroup) and
`/api/v1`, `/apis/{group}/{version}` (APIResourceList) are built from the kinds the store
keeps (`objects.KINDS`), so a kind added there is discoverable at once. The custom kinds
are also served as read-only `CustomResourceDefinition` objects under
`apiextensions.k8s.io/v1`, as the CRDs installed by their operators would be: Slinky's with
the published schema the emulator checks them against (`crd_schema`), the others with
an open one.

Only the plain (non-aggregated) discovery documents are served: kubectl asks for the
aggregated `apidiscovery.k8s.io/v2` form first and falls back when the answer's
Content-Type is plain `application/json`.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass

from autoclusters.sandbox.kubernetes import access
from autoclusters.sandbox.kubernetes.crd_schema import schema_for
from autoclusters.sandbox.kubernetes.objects import KINDS, ApiError, Kind, Obj, not_found
from autoclusters.sandbox.kubernetes.scale import has_scale, paths

# What the store does with every kind (no deletecollection: the emulator refuses it).
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
_SUB_VERBS = ["get", "patch", "update"]
CRD_GROUP_VERSION = "apiextensions.k8s.io/v1"
CRD_RESOURCE = "customresourcedefinitions"
# kubectl's short names: those of the real API server for built-ins (`kubectl get no`).
_SHORT_NAMES = {
    "nodes": ["no"],
    "pods": ["po"],
    "namespaces": ["ns"],
    "events": ["ev"],
    "configmaps": ["cm"],
    "persistentvolumeclaims": ["pvc"],
    "deployments": ["deploy"],
    "daemonsets": ["ds"],
    "poddisruptionbudgets": ["pdb"],
    CRD_RESOURCE: ["crd", "crds"],
}
# `kubectl get all` lists the resources in the category "all", as on a real server.
_CATEGORIES = {"pods": ["all"], "deployments": ["all"], "daemonsets": ["all"]}


@dataclass(frozen=True)
class _Sub:
    """A subresource as discovery lists it; `api_version`/`kind` when not the parent's."""

    name: str
    kind: str
    verbs: list[str]
    api_version: str = ""


def _subresources(kind: Kind) -> list[_Sub]:
    subs = []
    if kind.status_subresource and not kind.custom:
        subs.append(_Sub("status", kind.kind, _SUB_VERBS))
    if kind.resource == "pods":
        # kubectl drain looks for exactly this entry (group policy, version v1, kind
        # Eviction) before it evicts rather than deletes.
        subs.append(_Sub("eviction", "Eviction", ["create"], "policy/v1"))
    if has_scale(kind):  # Deployments, and a CRD that declares subresources.scale
        subs.append(_Sub("scale", "Scale", _SUB_VERBS, "autoscaling/v1"))
    return subs


def _hash(text: str) -> str:
    """A stable storageVersionHash: clients only compare it for equality."""
    return hashlib.sha256(text.encode()).digest()[:8].hex()


def _singular(kind: Kind) -> str:
    return kind.kind.lower()


def _resource_entries(kind: Kind) -> list[Obj]:
    entry: Obj = {
        "name": kind.resource,
        "singularName": _singular(kind),
        "namespaced": kind.namespaced,
        "kind": kind.kind,
        "verbs": list(_VERBS),
        "storageVersionHash": _hash(f"{kind.api_version}/{kind.resource}"),
    }
    if kind.resource in _SHORT_NAMES:
        entry["shortNames"] = _SHORT_NAMES[kind.resource]
    if kind.resource in _CATEGORIES:
        entry["categories"] = _CATEGORIES[kind.resource]
    out = [entry]
    for sub in _subresources(kind):
        item: Obj = {
            "name": f"{kind.resource}/{sub.name}",
            "singularName": "",
            "namespaced": kind.namespaced,
            "kind": sub.kind,
            "verbs": sub.verbs,
        }
        if sub.api_version:
            group, _, version = sub.api_version.rpartition("/")
            item.update(group=group, version=version)
        out.append(item)
    return out


_CRD_ENTRY: Obj = {
    "name": CRD_RESOURCE,
    "singularName": "customresourcedefinition",
    "namespaced": False,
    "kind": "CustomResourceDefinition",
    "verbs": ["get", "list"],
    "shortNames": _SHORT_NAMES[CRD_RESOURCE],
    "storageVersionHash": _hash(f"{CRD_GROUP_VERSION}/{CRD_RESOURCE}"),
}


def group_versions() -> dict[str, list[str]]:
    """Every group the emulator serves (core as "") and its versions, in discovery order."""
    out: dict[str, list[str]] = {}
    for kind in KINDS.values():
        group, _, version = kind.api_version.rpartition("/")
        if version not in out.setdefault(group, []):
            out[group].append(version)
    out.setdefault("apiextensions.k8s.io", ["v1"])
    out.setdefault(access.KIND.group, ["v1"])  # kubectl auth can-i
    return out


def api_versions(server_address: str) -> Obj:
    """`GET /api`: the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": group_versions()[""],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> Obj:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def api_group_list() -> Obj:
    """`GET /apis`: the named groups."""
    groups = [_group(g, vs) for g, vs in group_versions().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(name: str) -> Obj:
    """`GET /apis/{group}`; a 404 for a group the emulator does not serve."""
    versions = group_versions().get(name)
    if not name or versions is None:
        raise _not_served()
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def resource_list(group_version: str) -> Obj:
    """`GET /api/v1` or `/apis/{group}/{version}`: the resources of one group version."""
    resources = [
        entry
        for kind in KINDS.values()
        if kind.api_version == group_version
        for entry in _resource_entries(kind)
    ]
    if group_version == CRD_GROUP_VERSION:
        resources.append(_CRD_ENTRY)
    if group_version == access.GROUP_VERSION:
        resources.append(access.DISCOVERY)
    if not resources:
        raise _not_served()
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _not_served() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


# -- the custom kinds as CustomResourceDefinition objects --------------------------------------


def _crd(kind: Kind) -> Obj:
    group, _, version = kind.api_version.rpartition("/")
    name = f"{kind.resource}.{group}"
    names = {
        "plural": kind.resource,
        "singular": _singular(kind),
        "kind": kind.kind,
        "listKind": f"{kind.kind}List",
    }
    published = schema_for(kind)
    # Stored as given (no published schema: Crusoe's kinds), or the published one, trimmed.
    schema: Obj = (
        copy.deepcopy(published.root)
        if published is not None
        else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    )
    scale = paths(kind)
    return {
        "apiVersion": CRD_GROUP_VERSION,
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": name,
            "uid": _uid(name),
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2025-01-01T00:00:00Z",
        },
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    **({"subresources": {"scale": scale}} if scale else {}),
                }
            ],
        },
        "status": {
            "acceptedNames": names,
            "storedVersions": [version],
            "conditions": [
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
            ],
        },
    }


def _uid(name: str) -> str:
    h = hashlib.sha256(name.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def crds() -> list[Obj]:
    return [_crd(k) for k in KINDS.values() if k.custom]


CRD_KIND = Kind(CRD_RESOURCE, "CustomResourceDefinition", CRD_GROUP_VERSION, namespaced=False)


def crd_list() -> Obj:
    return {
        "kind": "CustomResourceDefinitionList",
        "apiVersion": CRD_GROUP_VERSION,
        "metadata": {"resourceVersion": "1"},
        "items": crds(),
    }


def crd(name: str) -> Obj:
    for obj in crds():
        if obj["metadata"]["name"] == name:
            return obj
    raise not_found(CRD_KIND, name)


def discover(path: str, server_address: str) -> Obj | None:
    """The discovery document (or CRD read) a GET of `path` asks for; None when `path` is a
    resource path for the store."""
    segs = [s for s in path.split("/") if s]
    if segs == ["api"]:
        return api_versions(server_address)
    if len(segs) == 2 and segs[0] == "api":
        return resource_list(segs[1])
    if segs == ["apis"]:
        return api_group_list()
    if len(segs) == 2 and segs[0] == "apis":
        return api_group(segs[1])
    if len(segs) == 3 and segs[0] == "apis":
        return resource_list(f"{segs[1]}/{segs[2]}")
    if segs[:4] == ["apis", *CRD_GROUP_VERSION.split("/"), CRD_RESOURCE]:
        if len(segs) == 4:
            return crd_list()
        if len(segs) == 5:
            return crd(segs[4])
    return None
