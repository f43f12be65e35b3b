"""Slinky's custom resources checked against their published CRD schemas, as kube-apiserver
checks a custom resource on create, update (PUT) and patch (the patched result).

The schemas are trimmed copies of SchedMD's published CRDs, in
`sandbox/kubernetes/slinky_crds/` (each file names the commit and path it came from).
Crusoe's `slurmclusters`/`slurmusers` have no published schema here and stay stored as given.

What the API server does, and so the emulator (sources: github.com/kubernetes/
apiextensions-apiserver 1aa2717, kube-openapi d427ff9, apimachinery eed236c, 2026-07):

- decoding (`customresource_handler.go`, `unstructuredSchemaCoercer.apply`): fields the
  schema does not know are pruned (`schema/pruning/algorithm.go`), silently, except below an
  `x-kubernetes-preserve-unknown-fields` node; `apiVersion`, `kind` and `metadata` at the
  root are left to the object-meta checks. `?fieldValidation=Strict` (what kubectl sends)
  refuses them instead, 400 `strict decoding error: unknown field "spec.x"`; `Warn` (the
  default) prunes them with a `Warning` header each; `Ignore` prunes quietly. Then nulls in
  non-nullable fields are dropped (`schema/defaulting/prunenulls.go`; the API server would
  put a field's default there, and the emulator applies no defaults);
- validation (`registry/customresource/strategy.go` and `validator.go`,
  `apiserver/validation/validation.go`): type (`x-kubernetes-int-or-string` is type
  `integer,string`; an integral float passes as an integer), `required`, `enum`,
  `nullable`, `pattern`, `minimum`, `maxLength`, `minLength`, nested `properties`,
  `additionalProperties` and `items`; the scale subresource's replicas paths non-negative
  int32s; then the CRD's CEL rules (`x-kubernetes-validations`), unless an error that
  blocks them came first. Any error is a 422 `Invalid` `Status` naming each field in
  `details.causes`, with kube-openapi's and apimachinery's messages
  (`spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer:
  "string"`), and nothing is stored.

Not done: defaulting (Slinky's `default`s stay in the schema files as documentation: a CEL
rule below reads an absent field as its default); ratcheting (1.33 accepts an update that
leaves an already invalid part unchanged; the emulator never stores an invalid object, so
only a `--state` file written before these checks could hold one); `format` (the API server
checks none that these CRDs use); list-type map/set uniqueness (only in `status.conditions`).
There is no CEL interpreter here: each rule is a Python predicate in `_RULES`, looked up by
its exact text, and a schema file with a rule not in that table fails to load.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from autoclusters.sandbox.kubernetes.objects import ApiError, Kind, Obj, bad_request

SCHEMA_DIR = Path(__file__).with_name("slinky_crds")
DIRECTIVES = ("", "Ignore", "Strict", "Warn")  # `?fieldValidation=`; "" is Warn
_PRESERVE = "x-kubernetes-preserve-unknown-fields"
_INT_OR_STRING = "x-kubernetes-int-or-string"
_RULES_KEY = "x-kubernetes-validations"
_ROOT_META = ("apiVersion", "kind", "metadata")
_MAX_INT32 = 2**31 - 1
_OMIT = object()  # a CEL failure on an object: apimachinery's field.OmitValueType
# Errors that keep the CEL rules from running (`strategy.go` hasBlockingErr), and what is
# said instead.
_BLOCKING = (
    "FieldValueNotSupported",
    "FieldValueRequired",
    "FieldValueTooLong",
    "FieldValueTooMany",
    "FieldValueTypeInvalid",
)
_NOT_CHECKED = (
    "some validation rules were not checked because the object was invalid; correct the "
    "existing errors to complete validation"
)


def _ext(s: Obj) -> bool:
    return bool(s.get("external", False))  # `default: false`


# The CRDs' CEL rules, by their exact text. `self` is the object at the rule's node; an
# absent field reads as its schema default, which the API server would have set first.
_RULES: dict[str, Callable[[Obj], bool]] = {
    "!self.external ? has(self.slurmKeyRef) : true": lambda s: _ext(s) or "slurmKeyRef" in s,
    "!self.external ? has(self.jwtKeyRef) || has(self.jwtHs256KeyRef) : true": lambda s: (
        _ext(s) or "jwtKeyRef" in s or "jwtHs256KeyRef" in s
    ),
    "self.external ? has(self.externalConfig) : true": lambda s: (
        not _ext(s) or "externalConfig" in s
    ),
    # `persistence.enabled` defaults to true; a missing existingClaim is a CEL error (no such
    # key) on a real server, a failed rule here.
    "has(self.ha) && self.ha.enabled ? has(self.persistence) && self.persistence.enabled && "
    "self.persistence.existingClaim.size() > 0 : true": lambda s: (
        not (s.get("ha") or {}).get("enabled")
        or (
            isinstance(s.get("persistence"), dict)
            and bool(s["persistence"].get("enabled", True))
            and len(str(s["persistence"].get("existingClaim") or "")) > 0
        )
    ),
    # `type` defaults to RollingUpdate; `scheduledUpdate.duration` to 30m once
    # scheduledUpdate is there. With no scheduledUpdate, the real rule errors (no such key).
    "self.type != 'ScheduledUpdate' || (has(self.scheduledUpdate.startTime) && "
    "has(self.scheduledUpdate.duration))": lambda s: (
        s.get("type", "RollingUpdate") != "ScheduledUpdate"
        or (isinstance(s.get("scheduledUpdate"), dict) and "startTime" in s["scheduledUpdate"])
    ),
}


@dataclass
class FieldValidation:
    """A write's `?fieldValidation=` directive, and the warnings it collects (Warn)."""

    directive: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CrdSchema:
    group: str
    version: str
    kind: str
    plural: str
    root: Obj
    scale: Obj
    has_rules: bool

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}"


def _rules_in(s: Any) -> list[str]:
    if isinstance(s, dict):
        found = [r["rule"] for r in s.get(_RULES_KEY) or []]
        for v in s.values():
            found += _rules_in(v)
        return found
    if isinstance(s, list):
        return [r for v in s for r in _rules_in(v)]
    return []


def _load(path: Path) -> CrdSchema:
    doc = yaml.safe_load(path.read_text())
    rules = _rules_in(doc["openAPIV3Schema"])
    unknown = [r for r in rules if r not in _RULES]
    if unknown:
        raise RuntimeError(f"{path.name}: CEL rules with no predicate in _RULES: {unknown}")
    return CrdSchema(
        group=doc["group"],
        version=doc["version"],
        kind=doc["kind"],
        plural=doc["plural"],
        root=doc["openAPIV3Schema"],
        scale=(doc.get("subresources") or {}).get("scale") or {},
        has_rules=bool(rules),
    )


@cache
def schemas() -> dict[tuple[str, str], CrdSchema]:
    """The published schemas by (apiVersion, plural)."""
    out = {}
    for path in sorted(SCHEMA_DIR.glob("*.yaml")):
        crd = _load(path)
        out[(f"{crd.group}/{crd.version}", crd.plural)] = crd
    return out


def schema_for(kind: Kind) -> CrdSchema | None:
    return schemas().get((kind.api_version, kind.resource))


# -- decoding: pruning -------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _prune(x: Any, s: Obj | None, path: str, unknown: list[str], *, root: bool = False) -> None:
    if s is not None and s.get(_PRESERVE):
        _skip_prune(x, s, path, unknown)
        return
    if isinstance(x, dict):
        props = (s or {}).get("properties") or {}
        extra = (s or {}).get("additionalProperties")
        for k in list(x):
            if root and k in _ROOT_META:
                continue
            if s is not None and k in props:
                _prune(x[k], props[k], _join(path, k), unknown)
            elif isinstance(extra, dict):
                _prune(x[k], extra, _join(path, k), unknown)
            else:
                unknown.append(_join(path, k))
                del x[k]
    elif isinstance(x, list):
        items = (s or {}).get("items")
        for i, v in enumerate(x):
            _prune(v, items, f"{path}[{i}]", unknown)


def _skip_prune(x: Any, s: Obj | None, path: str, unknown: list[str]) -> None:
    """Below x-kubernetes-preserve-unknown-fields: unknown fields stay, known ones are pruned
    by their own schemas."""
    if s is None:
        return
    if isinstance(x, dict):
        props = s.get("properties") or {}
        extra = s.get("additionalProperties")
        for k in list(x):
            if k in props:
                _prune(x[k], props[k], _join(path, k), unknown)
            elif isinstance(extra, dict):
                _prune(x[k], extra, _join(path, k), unknown)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _skip_prune(v, s.get("items"), f"{path}[{i}]", unknown)


def _field_schema(key: str, s: Obj | None) -> Obj | None:
    if s is None:
        return None
    props = s.get("properties") or {}
    if key in props:
        return props[key]
    extra = s.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def _drop_nulls(x: Any, s: Obj | None, *, root: bool = False) -> None:
    if isinstance(x, dict):
        for k in list(x):
            if root and k in _ROOT_META:
                continue
            sub = _field_schema(k, s)
            if x[k] is None and sub is not None and not sub.get("nullable"):
                del x[k]
            else:
                _drop_nulls(x[k], sub)
    elif isinstance(x, list):
        for v in x:
            _drop_nulls(v, (s or {}).get("items"))


def _options_kind(verb: str) -> str:
    return {"create": "CreateOptions", "update": "UpdateOptions"}.get(verb, "PatchOptions")


def decode(kind: Kind, obj: Obj, verb: str, fields: FieldValidation | None = None) -> None:
    """What the API server's decoder does to a custom resource's body (`verb` is create,
    update or patch): prune unknown fields in place, or refuse them (Strict, 400)."""
    crd = schema_for(kind)
    if crd is None:
        return
    fields = fields if fields is not None else FieldValidation()
    if fields.directive not in DIRECTIVES:
        supported = ", ".join(json.dumps(d) for d in DIRECTIVES)
        body = f"Unsupported value: {json.dumps(fields.directive)}: supported values: {supported}"
        options = _options_kind(verb)
        cause = {"reason": "FieldValueNotSupported", "message": body, "field": "fieldValidation"}
        raise ApiError(
            422,
            "Invalid",
            f'{options}.meta.k8s.io "" is invalid: fieldValidation: {body}',
            {"group": "meta.k8s.io", "kind": options, "causes": [cause]},
        )
    unknown: list[str] = []
    _prune(obj, crd.root, "", unknown, root=True)
    unknown.sort()
    if unknown and fields.directive == "Strict":
        strict = "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown)
        if verb != "patch":
            strict = (
                f'{crd.kind} in version "{crd.version}" cannot be handled as a {crd.kind}: {strict}'
            )
        raise bad_request(strict)
    if fields.directive in ("", "Warn"):
        fields.warnings += [f'unknown field "{p}"' for p in unknown]
    _drop_nulls(obj, crd.root, root=True)


# -- validation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Error:
    """apimachinery's field.Error: `reason` is its type, `body` its ErrorBody()."""

    reason: str
    field: str
    body: str


def _show(value: Any) -> str:
    """A bad value as field.Error prints it: numbers and booleans bare, strings quoted, the
    rest as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    return json.dumps(value, ensure_ascii=False)


def _invalid(path: str, value: Any, detail: str) -> _Error:
    shown = "Invalid value" if value is _OMIT else f"Invalid value: {_show(value)}"
    return _Error("FieldValueInvalid", path, f"{shown}: {detail}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _types(s: Obj) -> list[str]:
    if s.get(_INT_OR_STRING):
        return ["integer", "string"]
    return [s["type"]] if s.get("type") else []


def _same(a: Any, b: Any) -> bool:
    """JSON equality (True is not 1)."""
    return _json_type(a) == _json_type(b) and a == b


_Rule = tuple[str, Any, list[Obj]]


def _check(x: Any, s: Obj, path: str, errs: list[_Error], rules: list[_Rule]) -> None:
    types = _types(s)
    if x is None:
        if types and not s.get("nullable"):
            errs.append(_type_error(path, "null", types))
        return
    got = _json_type(x)
    integral = got == "number" and float(x).is_integer() and "integer" in types
    if types and got not in types and not integral:
        errs.append(_type_error(path, got, types))
        return
    if "enum" in s and not any(_same(x, v) for v in s["enum"]):
        allowed = ", ".join(
            json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in s["enum"]
        )
        detail = f"Unsupported value: {_show(x)}: supported values: {allowed}"
        errs.append(_Error("FieldValueNotSupported", path, detail))
    if isinstance(x, str):
        _check_string(x, s, path, errs)
    elif got in ("integer", "number") and "minimum" in s and x < s["minimum"]:
        detail = f"{path} in body should be greater than or equal to {_show(s['minimum'])}"
        errs.append(_invalid(path, x, detail))
    if s.get(_RULES_KEY):
        rules.append((path, x, s[_RULES_KEY]))
    if isinstance(x, dict):
        for k in s.get("required") or []:
            if k not in x:
                errs.append(_Error("FieldValueRequired", _join(path, k), "Required value"))
        props = s.get("properties") or {}
        extra = s.get("additionalProperties")
        for k, v in x.items():
            if k in props:
                _check(v, props[k], _join(path, k), errs, rules)
            elif isinstance(extra, dict):
                _check(v, extra, _join(path, k), errs, rules)
    elif isinstance(x, list) and isinstance(s.get("items"), dict):
        for i, v in enumerate(x):
            _check(v, s["items"], f"{path}[{i}]", errs, rules)


def _type_error(path: str, got: str, types: list[str]) -> _Error:
    detail = f'{path} in body must be of type {",".join(types)}: "{got}"'
    return _Error("FieldValueTypeInvalid", path, f'Invalid value: "{got}": {detail}')


def _check_string(x: str, s: Obj, path: str, errs: list[_Error]) -> None:
    if "maxLength" in s and len(x) > s["maxLength"]:
        unit = "byte" if s["maxLength"] == 1 else "bytes"
        detail = f"Too long: may not be more than {s['maxLength']} {unit}"
        errs.append(_Error("FieldValueTooLong", path, detail))
    if "minLength" in s and len(x) < s["minLength"]:
        errs.append(
            _invalid(path, x, f"{path} in body should be at least {s['minLength']} chars long")
        )
    if "pattern" in s and not re.search(s["pattern"], x):
        errs.append(_invalid(path, x, f"{path} in body should match '{s['pattern']}'"))


def _at(obj: Obj, dotted: str) -> Any:
    x: Any = obj
    for part in dotted.strip(".").split("."):
        if not isinstance(x, dict) or part not in x:
            return None
        x = x[part]
    return x


def _check_scale(obj: Obj, scale: Obj, errs: list[_Error]) -> None:
    """The scale subresource's replicas paths hold non-negative int32s (`validator.go`)."""
    for key in ("specReplicasPath", "statusReplicasPath"):
        path = scale.get(key)
        value = _at(obj, path) if path else None
        if not isinstance(value, int) or isinstance(value, bool):
            continue  # absent, or a type error the schema reports
        if value < 0:
            errs.append(_invalid(path or "", value, "should be a non-negative integer"))
        elif value > _MAX_INT32:
            errs.append(
                _invalid(path or "", value, f"should be less than or equal to {_MAX_INT32}")
            )


def validate(kind: Kind, obj: Obj) -> None:
    """A 422 `Invalid` naming every field the published schema refuses; nothing otherwise."""
    crd = schema_for(kind)
    if crd is None:
        return
    errs: list[_Error] = []
    rules: list[_Rule] = []
    _check(obj, crd.root, "", errs, rules)
    _check_scale(obj, crd.scale, errs)
    if crd.has_rules:
        if any(e.reason in _BLOCKING for e in errs):
            errs.append(_invalid("<nil>", None, _NOT_CHECKED))
        else:
            for path, value, node_rules in rules:
                for rule in node_rules:
                    if not _RULES[rule["rule"]](value):
                        errs.append(_invalid(path or "<nil>", _OMIT, rule["message"].strip()))
    if errs:
        raise _invalid_error(crd, str((obj.get("metadata") or {}).get("name") or ""), errs)


def _invalid_error(crd: CrdSchema, name: str, errs: list[_Error]) -> ApiError:
    """apimachinery's errors.NewInvalid: the aggregate message (deduplicated; in brackets
    when more than one) and one cause per error."""
    messages = list(dict.fromkeys(f"{e.field}: {e.body}" for e in errs))
    aggregate = messages[0] if len(messages) == 1 else "[" + ", ".join(messages) + "]"
    details = {
        "name": name,
        "group": crd.group,
        "kind": crd.kind,
        "causes": [{"reason": e.reason, "message": e.body, "field": e.field} for e in errs],
    }
    return ApiError(422, "Invalid", f'{crd.group_kind} "{name}" is invalid: {aggregate}', details)
