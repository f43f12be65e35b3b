"""Slinky's custom resources against their published CRD schemas, in the Kubernetes API
emulator on loopback (sandbox/kubernetes/crd_schema.py, the schemas in
sandbox/kubernetes/slinky_crds/).

Aspects: the product's Controller, Accounting, LoginSet and NodeSet bodies are accepted as
they are; a missing required field, a wrong type, a value outside an enum, a broken pattern
or a negative replicas is a 422 `Invalid` whose causes name the field, and nothing is
stored; the CEL rules (a Controller's key references) are enforced, and held back by a
blocking error as the API server does; unknown fields are pruned (a `Warning` each), kept
under x-kubernetes-preserve-unknown-fields, and refused with fieldValidation=Strict (400);
nulls in non-nullable fields are dropped; a PUT or a patch (merge or JSON) that makes an
object invalid is refused and leaves it as it was; Crusoe's kinds stay stored as given; the
served CRDs carry the published schema; the sandbox's seeded NodeSet is valid; every schema
file names its source commit and every CEL rule in it has a predicate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import (
    ACCOUNTING,
    CONTROLLER,
    LOGINSET,
    NODESET,
    CustomKind,
    accounting_body,
    controller_body,
    loginset_body,
    nodeset_body,
)
from autoclusters.sandbox.kubernetes.crd_schema import SCHEMA_DIR, schemas
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import kubernetes_mode as slinky
from tests.activities.test_cluster_provider_cmk import _spec

TOKEN = "crd-schema-test-token"
NS = "slurm"
SOURCE_COMMIT = "f2ed3fc5325271cef6311c1f92c6c75efe122bb1"
Obj = dict[str, Any]


@pytest.fixture
def emu() -> Iterator[Running]:
    with running(TOKEN, tls=True) as e:
        httpx.post(
            f"{e.url}/api/v1/namespaces",
            json={"metadata": {"name": NS}},
            headers={"Authorization": f"Bearer {TOKEN}"},
            verify=e.verify,
        ).raise_for_status()
        yield e


@pytest.fixture
def k8s(emu: Running) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=emu.url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
        verify=emu.verify,
    ) as c:
        yield c


@pytest.fixture
def custom(emu: Running, tmp_path: Path) -> Iterator[client.CustomObjectsApi]:
    (tmp_path / "kubeconfig").write_text(emu.kubeconfig())
    api = api_client(kubeconfig=tmp_path / "kubeconfig")
    yield client.CustomObjectsApi(api)
    api.close()


def _path(kind: CustomKind, name: str | None = None) -> str:
    base = f"/apis/{kind.api_version}/namespaces/{NS}/{kind.plural}"
    return f"{base}/{name}" if name else base


def _nodeset(name: str = "gpu", **spec: Any) -> Obj:
    return {
        "apiVersion": NODESET.api_version,
        "kind": NODESET.kind,
        "metadata": {"name": name},
        "spec": {"controllerRef": {"name": "alpha"}, **spec},
    }


# A NodeSet's or a Controller's CRD has CEL rules: after a type, required or enum error the
# API server adds this cause instead of running them.
NOT_CHECKED = (
    "<nil>",
    "FieldValueInvalid",
    "Invalid value: null: some validation rules were not checked because the object was "
    "invalid; correct the existing errors to complete validation",
)


def _causes(r: httpx.Response) -> list[tuple[str, str, str]]:
    status = r.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid", status
    return [(c["field"], c["reason"], c["message"]) for c in status["details"]["causes"]]


def _stored(k8s: httpx.Client, kind: CustomKind) -> list[str]:
    r = k8s.get(_path(kind))
    r.raise_for_status()
    return [o["metadata"]["name"] for o in r.json()["items"]]


# --- the product's bodies ------------------------------------------------------------------


def test_the_products_bodies_are_valid_as_they_are(custom: client.CustomObjectsApi) -> None:
    spec = _spec()
    bodies = [
        (CONTROLLER, controller_body(spec)),
        (ACCOUNTING, accounting_body(spec)),
        (LOGINSET, loginset_body(spec)),
        *((NODESET, nodeset_body(spec.name, ns)) for ns in spec.node_sets),
    ]
    for kind, body in bodies:
        made = custom.create_namespaced_custom_object(
            kind.group, kind.version, NS, kind.plural, body
        )
        assert made["spec"] == body["spec"], kind.kind  # nothing pruned, nothing refused


# --- required fields and types -------------------------------------------------------------


def test_a_missing_required_field_is_422_naming_it_and_stores_nothing(k8s: httpx.Client) -> None:
    body = _nodeset()
    del body["spec"]["controllerRef"]
    r = k8s.post(_path(NODESET), json=body)
    assert r.status_code == 422
    assert r.json()["message"] == (
        'NodeSet.slinky.slurm.net "gpu" is invalid: [spec.controllerRef: Required value, '
        f"{NOT_CHECKED[0]}: {NOT_CHECKED[2]}]"
    )
    assert r.json()["details"]["group"] == "slinky.slurm.net"
    assert r.json()["details"]["kind"] == "NodeSet"
    assert _causes(r) == [
        ("spec.controllerRef", "FieldValueRequired", "Required value"),
        NOT_CHECKED,
    ]

    login = {
        "apiVersion": LOGINSET.api_version,
        "kind": "LoginSet",
        "metadata": {"name": "l"},
        "spec": {"controllerRef": {"name": "alpha"}, "sssdConfRef": {"name": "s"}},
    }
    r = k8s.post(_path(LOGINSET), json=login)
    assert r.status_code == 422
    assert _causes(r) == [("spec.sssdConfRef.key", "FieldValueRequired", "Required value")]
    assert _stored(k8s, NODESET) == [] and _stored(k8s, LOGINSET) == []


def test_a_wrong_type_is_422_naming_the_field_and_stores_nothing(k8s: httpx.Client) -> None:
    r = k8s.post(_path(NODESET), json=_nodeset(replicas="two"))
    assert r.status_code == 422
    message = 'Invalid value: "string": spec.replicas in body must be of type integer: "string"'
    assert _causes(r) == [("spec.replicas", "FieldValueTypeInvalid", message), NOT_CHECKED]
    assert r.json()["message"].startswith(
        f'NodeSet.slinky.slurm.net "gpu" is invalid: [spec.replicas: {message}, <nil>: '
    )

    r = k8s.post(
        _path(NODESET),
        json=_nodeset(
            controllerRef="alpha",
            oversubscribeNode="yes",
            partition={"enabled": True, "config": "PartitionName=a\nState=UP"},
            scalingMode="Deployment",
            updateStrategy={"rollingUpdate": {"maxUnavailable": True}},
        ),
    )
    assert r.status_code == 422
    assert sorted(_causes(r)) == [
        NOT_CHECKED,
        ("spec.controllerRef", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.controllerRef in body must be of type object: "string"'),
        ("spec.oversubscribeNode", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.oversubscribeNode in body must be of type boolean: '
         '"string"'),
        ("spec.partition.config", "FieldValueInvalid",
         'Invalid value: "PartitionName=a\\nState=UP": spec.partition.config in body should '
         "match '^[^\\n]+$'"),
        ("spec.scalingMode", "FieldValueNotSupported",
         'Unsupported value: "Deployment": supported values: "DaemonSet", "StatefulSet"'),
        ("spec.updateStrategy.rollingUpdate.maxUnavailable", "FieldValueTypeInvalid",
         'Invalid value: "boolean": spec.updateStrategy.rollingUpdate.maxUnavailable in body '
         'must be of type integer,string: "boolean"'),
    ]  # fmt: skip
    assert _stored(k8s, NODESET) == []


def test_items_int_or_string_and_scale(k8s: httpx.Client) -> None:
    ctl = controller_body(_spec())
    ctl["spec"]["configFileRefs"] = [{"name": "a"}, {"name": 3}]
    r = k8s.post(_path(CONTROLLER), json=ctl)
    assert r.status_code == 422
    assert [c[0] for c in _causes(r)] == ["spec.configFileRefs[1].name", "<nil>"]

    r = k8s.post(_path(NODESET), json=_nodeset(replicas=-1))
    assert r.status_code == 422
    negative = "Invalid value: -1: should be a non-negative integer"
    assert _causes(r) == [(".spec.replicas", "FieldValueInvalid", negative)]
    for i, unavailable in enumerate((3, "50%")):
        strategy = {"rollingUpdate": {"maxUnavailable": unavailable}}
        body = _nodeset(f"gpu-{i}", replicas=2.0, updateStrategy=strategy)
        assert k8s.post(_path(NODESET), json=body).status_code == 201  # 2.0 is an integer


# --- CEL rules -----------------------------------------------------------------------------


def test_the_controllers_key_references_are_required_unless_external(k8s: httpx.Client) -> None:
    ctl = controller_body(_spec())
    del ctl["spec"]["slurmKeyRef"], ctl["spec"]["jwtKeyRef"]
    r = k8s.post(_path(CONTROLLER), json=ctl)
    assert r.status_code == 422
    no_slurm_key = "Invalid value: slurmKeyRef must be set when external is false"
    no_jwt_key = "Invalid value: jwtKeyRef or jwtHs256KeyRef must be set when external is false"
    assert _causes(r) == [
        ("spec", "FieldValueInvalid", no_slurm_key),
        ("spec", "FieldValueInvalid", no_jwt_key),
    ]
    ctl["spec"]["jwtHs256KeyRef"] = {"name": "alpha-jwt", "key": "jwt_hs256.key"}
    assert [c[2] for c in _causes(k8s.post(_path(CONTROLLER), json=ctl))] == [no_slurm_key]
    external = {**ctl, "spec": {"external": True}}
    r = k8s.post(_path(CONTROLLER), json=external)
    no_config = "Invalid value: externalConfig must be set when external is true"
    assert _causes(r) == [("spec", "FieldValueInvalid", no_config)]
    external["spec"]["externalConfig"] = {"host": "slurmctld.example", "port": 6817}
    assert k8s.post(_path(CONTROLLER), json=external).status_code == 201


def test_a_scheduled_update_needs_its_start_time(k8s: httpx.Client) -> None:
    strategy: Obj = {"type": "ScheduledUpdate"}
    r = k8s.post(_path(NODESET), json=_nodeset(updateStrategy=strategy))
    assert _causes(r) == [
        ("spec.updateStrategy", "FieldValueInvalid", "Invalid value: scheduledUpdate.startTime "
         "and scheduledUpdate.duration are required when type is ScheduledUpdate"),
    ]  # fmt: skip
    strategy["scheduledUpdate"] = {"startTime": "2026-09-01T00:00:00Z"}  # duration defaults
    assert k8s.post(_path(NODESET), json=_nodeset(updateStrategy=strategy)).status_code == 201


# --- unknown fields and nulls ----------------------------------------------------------------


def test_unknown_fields_are_pruned_with_a_warning(k8s: httpx.Client) -> None:
    body = _nodeset(
        bogus=1,
        controllerRef={"name": "alpha", "namespace": "x"},
        slurmd={"image": "slurmd:25.05", "anything": {"goes": True}},  # preserve-unknown
        template={
            "metadata": {"labels": {"a": "b"}, "stray": 1},
            "spec": {"nodeSelector": {"pool": "gpu"}, "notAPodField": 1},  # preserve-unknown
        },
    )
    body["topLevel"] = "x"
    r = k8s.post(_path(NODESET), json=body)
    assert r.status_code == 201, r.text
    assert r.headers.get_list("warning") == [
        '299 - "unknown field \\"spec.bogus\\""',
        '299 - "unknown field \\"spec.controllerRef.namespace\\""',
        '299 - "unknown field \\"spec.template.metadata.stray\\""',
        '299 - "unknown field \\"topLevel\\""',
    ]
    stored = k8s.get(_path(NODESET, "gpu")).json()
    assert "topLevel" not in stored
    assert stored["spec"] == {
        "controllerRef": {"name": "alpha"},
        "slurmd": {"image": "slurmd:25.05", "anything": {"goes": True}},
        "template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {"nodeSelector": {"pool": "gpu"}, "notAPodField": 1},
        },
    }
    quiet = k8s.post(_path(NODESET) + "?fieldValidation=Ignore", json=_nodeset("q", bogus=1))
    assert quiet.status_code == 201 and "warning" not in quiet.headers
    assert "bogus" not in quiet.json()["spec"]


def test_strict_field_validation_refuses_unknown_fields(k8s: httpx.Client) -> None:
    r = k8s.post(_path(NODESET) + "?fieldValidation=Strict", json=_nodeset(b=1, a=2))
    assert r.status_code == 400
    assert r.json()["reason"] == "BadRequest"
    assert r.json()["message"] == (
        'NodeSet in version "v1beta1" cannot be handled as a NodeSet: strict decoding error: '
        'unknown field "spec.a", unknown field "spec.b"'
    )
    assert _stored(k8s, NODESET) == []
    assert k8s.post(_path(NODESET) + "?fieldValidation=Strict", json=_nodeset()).status_code == 201
    r = k8s.patch(
        _path(NODESET, "gpu") + "?fieldValidation=Strict",
        json={"spec": {"c": 1}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 400
    assert r.json()["message"] == 'strict decoding error: unknown field "spec.c"'
    r = k8s.post(_path(NODESET) + "?fieldValidation=strict", json=_nodeset("x"))
    assert r.status_code == 422 and r.json()["details"]["kind"] == "CreateOptions"


def test_nulls_in_non_nullable_fields_are_dropped(k8s: httpx.Client) -> None:
    r = k8s.post(_path(NODESET), json=_nodeset(extraConf=None, volumeClaimTemplates=None))
    assert r.status_code == 201
    assert r.json()["spec"] == {"controllerRef": {"name": "alpha"}, "volumeClaimTemplates": None}


# --- updates -------------------------------------------------------------------------------


def test_an_update_or_patch_that_makes_it_invalid_is_refused(k8s: httpx.Client) -> None:
    made = k8s.post(_path(NODESET), json=_nodeset(replicas=2))
    assert made.status_code == 201
    before = k8s.get(_path(NODESET, "gpu")).json()
    merge = {"Content-Type": "application/merge-patch+json"}
    json_patch = {"Content-Type": "application/json-patch+json"}

    r = k8s.patch(_path(NODESET, "gpu"), json={"spec": {"replicas": "3"}}, headers=merge)
    assert r.status_code == 422 and _causes(r) == [
        ("spec.replicas", "FieldValueTypeInvalid",
         'Invalid value: "string": spec.replicas in body must be of type integer: "string"'),
        NOT_CHECKED,
    ]  # fmt: skip
    r = k8s.patch(_path(NODESET, "gpu"), json={"spec": {"controllerRef": None}}, headers=merge)
    assert r.status_code == 422 and _causes(r)[0][:2] == (
        "spec.controllerRef",
        "FieldValueRequired",
    )
    remove = [{"op": "remove", "path": "/spec/controllerRef"}]
    r = k8s.patch(_path(NODESET, "gpu"), json=remove, headers=json_patch)
    assert r.status_code == 422 and _causes(r)[0][0] == "spec.controllerRef"
    replaced = {**before, "spec": {"replicas": 2}}
    r = k8s.put(_path(NODESET, "gpu"), json=replaced)
    assert r.status_code == 422 and _causes(r)[0][0] == "spec.controllerRef"
    assert k8s.get(_path(NODESET, "gpu")).json() == before  # as it was, same resourceVersion

    r = k8s.patch(_path(NODESET, "gpu"), json={"spec": {"replicas": 3, "x": 1}}, headers=merge)
    assert r.status_code == 200
    assert r.json()["spec"] == {"controllerRef": {"name": "alpha"}, "replicas": 3}
    assert r.headers.get_list("warning") == ['299 - "unknown field \\"spec.x\\""']
    latest = r.json()
    r = k8s.put(_path(NODESET, "gpu"), json={**latest, "spec": {**latest["spec"], "y": 1}})
    assert r.status_code == 200 and "y" not in r.json()["spec"]


def test_the_products_patches_pass(custom: client.CustomObjectsApi) -> None:
    """What the provider patches later (cmk.py): accountingRef set and cleared, a node set's
    replicas and partition."""
    spec = _spec()
    where = (CONTROLLER.group, CONTROLLER.version, NS, CONTROLLER.plural)
    custom.create_namespaced_custom_object(*where, controller_body(spec))
    custom.patch_namespaced_custom_object(
        *where, "alpha", {"spec": {"accountingRef": {"name": "a"}}}
    )
    custom.patch_namespaced_custom_object(*where, "alpha", {"spec": {"accountingRef": None}})
    ns = spec.node_sets[0]
    sets = (NODESET.group, NODESET.version, NS, NODESET.plural)
    custom.create_namespaced_custom_object(*sets, nodeset_body("alpha", ns))
    patch = {"spec": {"replicas": 2, "partition": {"enabled": True, "config": "PartitionName=b"}}}
    got = custom.patch_namespaced_custom_object(*sets, "alpha-gpu", patch)
    assert got["spec"]["replicas"] == 2
    with pytest.raises(ApiException) as err:
        custom.patch_namespaced_custom_object(
            *sets, "alpha-gpu", {"spec": {"partition": {"enabled": None}}}
        )
    assert err.value.status == 422 and "spec.partition.enabled: Required value" in err.value.body


# --- around it -------------------------------------------------------------------------------


def test_crusoes_kinds_stay_stored_as_given(k8s: httpx.Client) -> None:
    body = {
        "apiVersion": "slurm.crusoe.ai/v1alpha1",
        "kind": "SlurmUser",
        "metadata": {"name": "u"},
        "spec": {"anything": [1, "two"]},
    }
    r = k8s.post(f"/apis/slurm.crusoe.ai/v1alpha1/namespaces/{NS}/slurmusers", json=body)
    assert r.status_code == 201 and r.json()["spec"] == {"anything": [1, "two"]}


def test_the_served_crds_carry_the_published_schema(k8s: httpx.Client) -> None:
    base = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    crd = k8s.get(f"{base}/nodesets.slinky.slurm.net").json()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["required"] == ["controllerRef"]
    crd = k8s.get(f"{base}/slurmusers.slurm.crusoe.ai").json()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_the_sandboxs_seeded_nodeset_is_valid(
    emu: Running, k8s: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SandboxConfig(state_dir=tmp_path)
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "token").write_text(TOKEN)
    cfg.k8s_ca.write_text(emu.ca_pem)
    monkeypatch.setattr(SandboxConfig, "k8s_url", property(lambda _: emu.url))
    slinky.seed(cfg)
    got = k8s.get(_path(NODESET, "gpu")).json()
    assert got["spec"] == {"controllerRef": {"name": cfg.cluster}, "scalingMode": "DaemonSet"}


def test_each_schema_names_its_source_and_every_rule_has_a_predicate() -> None:
    loaded = schemas()  # raises for a CEL rule with no predicate
    assert sorted(k[1] for k in loaded) == ["accountings", "controllers", "loginsets", "nodesets"]
    for path in SCHEMA_DIR.glob("*.yaml"):
        head = path.read_text()[:1000]
        assert "github.com/SlinkyProject/slurm-operator" in head and SOURCE_COMMIT in head
        assert f"config/crd/bases/slinky.slurm.net_{path.stem}.yaml" in head
