"""`GET /openapi/v2`: a Swagger 2.0 document of what the emulator serves.

kubectl 1.33 validates and explains through OpenAPI v3 (`openapi`); v2 is what older
clients and tools read (`kubectl get --raw /openapi/v2`, client generators). Each kind gets
its collection and object paths with the verbs the store answers, tagged the way
kube-apiserver tags them (`x-kubernetes-action`, `x-kubernetes-group-version-kind`), and a
definition that names its kind but describes no fields (`spec` and `status` are open
objects): enough to be a valid document that says what exists, not a schema to validate
against.

client-go's discovery asks for v2 in protobuf only (`Accept:
application/com.github.proto-openapi.spec.v2@v1.0+protobuf`); the emulator answers that 406,
as before, and kubectl falls back to its built-in types as it did when v2 was a 404.
"""

from __future__ import annotations

from autoclusters.sandbox.kubernetes.objects import KINDS, Kind, Obj

PROTOBUF_ONLY = "application/com.github.proto-openapi.spec.v2"
_VERSION = "v1.33.0"
_PATCH_TYPES = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
]
_STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
_PATCH = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"


def wants_protobuf_only(accept: str) -> bool:
    """Does the client take only the protobuf form (client-go's discovery)?"""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",") if part.strip()]
    return bool(kinds) and all(k.startswith(PROTOBUF_ONLY) for k in kinds)


def _definition_name(kind: Kind) -> str:
    """kube-apiserver's naming: `io.k8s.api.core.v1.Node`; a CRD's group reversed."""
    group, _, version = kind.api_version.rpartition("/")
    if not kind.custom:
        return f"io.k8s.api.{group.split('.')[0] if group else 'core'}.{version}.{kind.kind}"
    return ".".join([*reversed(group.split(".")), version, kind.kind])


def _gvk(kind: Kind) -> Obj:
    group, _, version = kind.api_version.rpartition("/")
    return {"group": group, "version": version, "kind": kind.kind}


def _ref(name: str) -> Obj:
    return {"$ref": f"#/definitions/{name}"}


def _path_param(name: str) -> Obj:
    return {"name": name, "in": "path", "required": True, "type": "string", "uniqueItems": True}


def _op(kind: Kind, action: str, verb: str, schema: Obj, *, body: Obj | None = None) -> Obj:
    op: Obj = {
        # kube-apiserver's ids: readNamespacedPod, readNode (unique across the document).
        "operationId": f"{action}{'Namespaced' if kind.namespaced else ''}{kind.kind}",
        "produces": ["application/json"],
        "consumes": _PATCH_TYPES if action == "patch" else ["application/json"],
        "tags": [kind.api_version.replace("/", "_")],
        "responses": {
            "200": {"description": "OK", "schema": schema},
            "401": {"description": "Unauthorized"},
        },
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": _gvk(kind),
    }
    if body is not None:
        op["parameters"] = [{"name": "body", "in": "body", "required": True, "schema": body}]
    return op


def _paths(kind: Kind) -> dict[str, Obj]:
    group, _, version = kind.api_version.rpartition("/")
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    scoped = f"{prefix}/namespaces/{{namespace}}" if kind.namespaced else prefix
    params = [_path_param("namespace")] if kind.namespaced else []
    one, many = _ref(_definition_name(kind)), _ref(f"{_definition_name(kind)}List")
    collection: Obj = {
        "get": _op(kind, "list", "list", many),
        "post": _op(kind, "create", "post", one, body=one),
    }
    if params:
        collection["parameters"] = params
    item: Obj = {
        "get": _op(kind, "read", "get", one),
        "put": _op(kind, "replace", "put", one, body=one),
        "patch": _op(kind, "patch", "patch", one, body=_ref(_PATCH)),
        "delete": _op(kind, "delete", "delete", _ref(_STATUS)),
        "parameters": [_path_param("name"), *params],
    }
    out = {f"{scoped}/{kind.resource}": collection, f"{scoped}/{kind.resource}/{{name}}": item}
    if kind.namespaced:  # the all-namespaces list, as kube-apiserver serves it
        out[f"{prefix}/{kind.resource}"] = {
            "get": {
                **_op(kind, "list", "list", many),
                "operationId": f"list{kind.kind}ForAllNamespaces",
            }
        }
    return out


def _definitions(kind: Kind) -> dict[str, Obj]:
    name = _definition_name(kind)
    gvk = [_gvk(kind)]
    obj: Obj = {
        "description": f"{kind.kind} ({kind.api_version}); fields as the API server takes them.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object"},
            "status": {"type": "object"},
        },
        "x-kubernetes-group-version-kind": gvk,
    }
    listed: Obj = {
        "description": f"A list of {kind.kind}.",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "items": {"type": "array", "items": _ref(name)},
        },
        "x-kubernetes-group-version-kind": [{**gvk[0], "kind": f"{kind.kind}List"}],
    }
    return {name: obj, f"{name}List": listed}


def document() -> Obj:
    paths: dict[str, Obj] = {}
    definitions: dict[str, Obj] = {
        _STATUS: {"description": "The API server's answer to a failure or a delete.",
                  "type": "object"},
        _PATCH: {"description": "A patch in one of the consumed formats.", "type": "object"},
    }  # fmt: skip
    for kind in KINDS.values():
        paths.update(_paths(kind))
        definitions.update(_definitions(kind))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": _VERSION},
        "paths": dict(sorted(paths.items())),
        "definitions": dict(sorted(definitions.items())),
        "securityDefinitions": {
            "BearerToken": {"type": "apiKey", "name": "authorization", "in": "header"}
        },
        "security": [{"BearerToken": []}],
    }
