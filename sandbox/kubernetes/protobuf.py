"""Request bodies in Kubernetes' protobuf encoding, for the few kinds kubectl sends that way.

kubectl's typed clients (`kubectl create namespace`, the evictions of `kubectl drain`, the
access review of `kubectl auth can-i`) send
`Content-Type: application/vnd.kubernetes.protobuf` and do not fall back to JSON on a 415.
The body is the `k8s\\0` magic and a `runtime.Unknown` envelope (typeMeta, raw) whose `raw`
is the object's own message. Only the fields the emulator acts on are decoded, by the
field numbers of k8s.io/api's `generated.proto`; the rest are skipped. Responses stay JSON:
kubectl accepts `application/json` as well.
"""

from __future__ import annotations

from typing import Any

from autoclusters.sandbox.kubernetes.objects import ApiError, Obj

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"

# A message schema: field number -> (JSON name, type). A type is "string", "int", "bool",
# "map" (map<string,string>), a nested schema, or a one-element list of either (repeated).
Schema = dict[int, tuple[str, Any]]

_TYPE_META: Schema = {1: ("apiVersion", "string"), 2: ("kind", "string")}
_UNKNOWN: Schema = {1: ("typeMeta", _TYPE_META), 2: ("raw", "bytes")}
_OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    11: ("labels", "map"),
    12: ("annotations", "map"),
    14: ("finalizers", ["string"]),
}
_DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int"),
    2: ("preconditions", {1: ("uid", "string"), 2: ("resourceVersion", "string")}),
    3: ("orphanDependents", "bool"),
    4: ("propagationPolicy", "string"),
    5: ("dryRun", ["string"]),
}
# authorization/v1 `ResourceAttributes`, `NonResourceAttributes` (kubectl auth can-i).
_RESOURCE_ATTRIBUTES: Schema = {
    1: ("namespace", "string"),
    2: ("verb", "string"),
    3: ("group", "string"),
    4: ("version", "string"),
    5: ("resource", "string"),
    6: ("subresource", "string"),
    7: ("name", "string"),
}
_NON_RESOURCE_ATTRIBUTES: Schema = {1: ("path", "string"), 2: ("verb", "string")}
KINDS: dict[str, Schema] = {
    "SelfSubjectAccessReview": {
        1: ("metadata", _OBJECT_META),
        2: (
            "spec",
            {
                1: ("resourceAttributes", _RESOURCE_ATTRIBUTES),
                2: ("nonResourceAttributes", _NON_RESOURCE_ATTRIBUTES),
            },
        ),
    },  # fmt: skip
    "Eviction": {1: ("metadata", _OBJECT_META), 2: ("deleteOptions", _DELETE_OPTIONS)},
    "DeleteOptions": _DELETE_OPTIONS,
    "Namespace": {1: ("metadata", _OBJECT_META), 2: ("spec", {1: ("finalizers", ["string"])})},
}


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one message; varints as ints, the rest as bytes."""
    out: list[tuple[int, int | bytes]] = []
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            out.append((number, value))
        elif wire == 2:
            size, i = _varint(data, i)
            out.append((number, data[i : i + size]))
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def _value(kind: Any, raw: int | bytes) -> Any:
    if kind == "int":
        assert isinstance(raw, int)
        return raw - (1 << 64) if raw >= 1 << 63 else raw  # int64, two's complement
    if kind == "bool":
        return bool(raw)
    assert isinstance(raw, bytes)
    if kind == "string":
        return raw.decode()
    if kind == "bytes":
        return raw
    if kind == "map":
        entry = decode_message(raw, {1: ("key", "string"), 2: ("value", "string")})
        return entry.get("key", ""), entry.get("value", "")
    return decode_message(raw, kind)


def decode_message(data: bytes, schema: Schema) -> Obj:
    out: Obj = {}
    for number, raw in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, list):
            out.setdefault(name, []).append(_value(kind[0], raw))
        elif kind == "map":
            key, value = _value(kind, raw)
            out.setdefault(name, {})[key] = value
        else:
            out[name] = _value(kind, raw)
    return out


def decode(body: bytes) -> Obj:
    """A protobuf request body as the JSON object it stands for (a 415 for other kinds)."""
    try:
        if not body.startswith(MAGIC):
            raise ValueError("no k8s protobuf magic")
        envelope = decode_message(body[len(MAGIC) :], _UNKNOWN)
        type_meta = envelope.get("typeMeta") or {}
        schema = KINDS.get(type_meta.get("kind", ""))
        if schema is None:
            raise _unsupported()
        obj = decode_message(envelope.get("raw", b""), schema)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, "BadRequest", f"the object provided is unrecognized ({e})") from None
    return {**{k: v for k, v in type_meta.items() if v}, **obj}


def _unsupported() -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json, application/yaml",
    )
