"""The smallest OpenAPI v3 documents that let `kubectl create`/`apply` go ahead.

Before it writes, kubectl checks whether the server validates fields itself: it looks in
`/openapi/v3/<group version>` for the kind's PATCH operation (by its
`x-kubernetes-group-version-kind`) and that operation's `fieldValidation` parameter. If
found, it sends `fieldValidation=Strict` and validates nothing client-side; if not, it
downloads the whole schema to validate locally and fails without it ("failed to download
openapi"). So each group version lists, per kind, a PATCH operation with that parameter
and nothing else: no request body (so client-side apply computes its patch from its
built-in types, or a JSON merge patch for custom resources) and no schemas.
"""

from __future__ import annotations

import hashlib
import json

from autoclusters.sandbox.kubernetes.discovery import group_versions
from autoclusters.sandbox.kubernetes.objects import KINDS, ApiError, Kind, Obj

_VERSION = "v1.33.0"


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _kinds(group: str, version: str) -> list[Kind]:
    gv = f"{group}/{version}" if group else version
    return [k for k in KINDS.values() if k.api_version == gv]


def _object_path(kind: Kind, prefix: str) -> str:
    ns = "/namespaces/{namespace}" if kind.namespaced else ""
    return f"/{prefix}{ns}/{kind.resource}/{{name}}"


def group_version_doc(group: str, version: str) -> Obj:
    prefix = _gv_path(group, version)
    paths = {
        _object_path(kind, prefix): {
            "patch": {
                "operationId": f"patch{kind.kind}",
                "x-kubernetes-group-version-kind": {
                    "group": group,
                    "version": version,
                    "kind": kind.kind,
                },
                "parameters": [
                    {
                        "name": "fieldValidation",
                        "in": "query",
                        "description": "How the server treats unknown or duplicate fields.",
                        "schema": {"type": "string", "uniqueItems": True},
                    }
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
        for kind in _kinds(group, version)
    }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": _VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }


def document(path: str) -> Obj:
    """`GET /openapi/{path}`: the v3 root (`v3`) or one group version's document."""
    segs = [s for s in path.split("/") if s]
    if segs == ["v3"]:
        out = {}
        for group, versions in group_versions().items():
            for version in versions:
                gv = _gv_path(group, version)
                digest = hashlib.sha256(
                    json.dumps(group_version_doc(group, version), sort_keys=True).encode()
                ).hexdigest()[:16]
                out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest.upper()}"}
        return {"paths": out}
    if segs[:1] == ["v3"]:
        rest = segs[1:]
        if len(rest) == 2 and rest[0] == "api":
            return group_version_doc("", rest[1])
        if len(rest) == 3 and rest[0] == "apis" and rest[2] in group_versions().get(rest[1], []):
            return group_version_doc(rest[1], rest[2])
    raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
