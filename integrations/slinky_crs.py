"""Slurm on a CMK cluster as Kubernetes objects: the bodies of Slinky's and Crusoe's custom
resources (crusoe.md §1.5, §3) and a small async store over the official `kubernetes`
client that creates, reads, patches and deletes them.

Names are the cluster's: the Slinky `Controller` is `<cluster>`, its `Accounting`
`<cluster>-accounting`, its `LoginSet` `<cluster>-login`, the /home claim `<cluster>-home`, a
node set's `NodeSet` `<cluster>-<set>`, the generated Slurm files the ConfigMap
`<cluster>-slurm-conf`, a user's `SlurmUser` `<cluster>-<user>`. Every object carries the
label `autoclusters.crusoe.ai/cluster: <cluster>`.

The Slinky bodies match the published v1beta1 CRD schemas (github SlinkyProject/
slurm-operator f2ed3fc, `config/crd/bases/slinky.slurm.net_*.yaml`; the sandbox's Kubernetes
emulator checks them: `sandbox/kubernetes/crd_schema.py`): `controllerRef`, `accountingRef`,
`configFileRefs` (ConfigMap references by `name`), `replicas`, `scalingMode`,
`partition {enabled, config}`, the LoginSet's `rootSshAuthorizedKeys` (a string) and its
required `sssdConfRef`, the Accounting's `storageConfig` with its required `host` and
`passwordKeyRef`, and the CEL rules of the Controller and the Accounting: with `external`
false (the default) each needs `slurmKeyRef` and `jwtKeyRef`. The node annotations
`nodeset.slinky.slurm.net/hostname-override` and `.../node-cordon-reason` are Slinky's
(`api/v1beta1/well_known.go`); Crusoe's `SlurmUser` (`clusterReference`, `fullName`,
`sshPublicKeys`) has no published schema here.

The Secrets those references name are SchedMD's `slurm` Helm chart's, with the cluster as
the release (`helm/slurm/templates/_slurm.tpl`, `cluster/_helpers.tpl`): `<cluster>-auth-slurm`
(key `slurm.key`), `<cluster>-auth-jwt` (`jwt.key`), `<cluster>-sssd-conf` (`sssd.conf`).
The accounting database follows the chart's defaults (`values.yaml`: host `mariadb`, user
`slurm`, password Secret `mariadb-password` key `password`), prefixed with the cluster. These
objects must exist for the operator to run the pods: the provider creates each with the
object that references it, with keys generated then and never replaced (`secret_body`; on
CMK nobody else is known to make them, UNCONFIRMED), and the `autoclusters.*` labels and
annotations are ours.

Reads and writes are the API's own JSON (`_preload_content=False`), run off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from autoclusters.core.cluster_spec import ClusterSpec, NodeSetSpec, UserSpec
from autoclusters.core.unavailable import Unavailable

Obj = dict[str, Any]

LABEL_CLUSTER = "autoclusters.crusoe.ai/cluster"
LABEL_NODE_SET = "autoclusters.crusoe.ai/node-set"
# On a NodeSet: which pool VM each slot (Slurm node) holds, and who changes the pool now.
ANN_SLOTS = "autoclusters.crusoe.ai/slots"
ANN_POOL_LOCK = "autoclusters.crusoe.ai/pool-lock"
# Slinky's node annotations (§3): the Slurm node name of a DaemonSet-mode node, and the
# drain reason a cordon carries into Slurm.
HOSTNAME_OVERRIDE = "nodeset.slinky.slurm.net/hostname-override"
CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
TOPOLOGY_KEY = "topology.conf"


@dataclass(frozen=True)
class CustomKind:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


CONTROLLER = CustomKind("slinky.slurm.net", "v1beta1", "controllers", "Controller")
ACCOUNTING = CustomKind("slinky.slurm.net", "v1beta1", "accountings", "Accounting")
LOGINSET = CustomKind("slinky.slurm.net", "v1beta1", "loginsets", "LoginSet")
NODESET = CustomKind("slinky.slurm.net", "v1beta1", "nodesets", "NodeSet")
SLURM_USER = CustomKind("slurm.crusoe.ai", "v1alpha1", "slurmusers", "SlurmUser")


def _meta(name: str, cluster: str, **labels: str) -> Obj:
    return {"name": name, "labels": {LABEL_CLUSTER: cluster, **labels}}


def config_map_name(cluster: str) -> str:
    return f"{cluster}-slurm-conf"


def nodeset_name(cluster: str, node_set: str) -> str:
    return f"{cluster}-{node_set}"


def slurm_key_ref(cluster: str) -> Obj:
    """The `auth/slurm` key Slurm's daemons share (the Controller's and the Accounting's)."""
    return {"name": f"{cluster}-auth-slurm", "key": "slurm.key"}


def jwt_key_ref(cluster: str) -> Obj:
    """The `auth/jwt` key (the Controller's and the Accounting's)."""
    return {"name": f"{cluster}-auth-jwt", "key": "jwt.key"}


def sssd_conf_ref(cluster: str) -> Obj:
    """The login nodes' `sssd.conf`."""
    return {"name": f"{cluster}-sssd-conf", "key": "sssd.conf"}


# The login pods' sssd.conf: local users only (the accounts are the SlurmUsers'); the
# chart's default is the same shape (helm/slurm/values.yaml `loginsets.*.sssdConf`).
SSSD_CONF = """\
[sssd]
config_file_version = 2
services = nss, pam
domains = DEFAULT

[nss]
filter_groups = root,slurm
filter_users = root,slurm

[pam]

[domain/DEFAULT]
auth_provider = none
id_provider = files
"""


def secret_body(cluster: str, ref: Obj) -> Obj:
    """The Secret a reference (`{name, key}`) names, its value generated now: Slurm's
    `auth/slurm` key and the JWT key are 1024 random bytes (as `slurm.key` is made), the
    database password 24 random characters, sssd.conf the one above."""
    key = ref["key"]
    if key == "sssd.conf":
        value = SSSD_CONF.encode()
    elif key == "password":
        value = secrets.token_urlsafe(18).encode()
    else:
        value = secrets.token_bytes(1024)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(ref["name"], cluster),
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode()},
    }


def mariadb_password_ref(cluster: str) -> Obj:
    return {"name": f"{cluster}-mariadb-password", "key": "password"}


def controller_body(spec: ClusterSpec) -> Obj:
    return {
        "apiVersion": CONTROLLER.api_version,
        "kind": CONTROLLER.kind,
        "metadata": _meta(spec.name, spec.name),
        "spec": {
            "clusterName": spec.name,
            "slurmKeyRef": slurm_key_ref(spec.name),
            "jwtKeyRef": jwt_key_ref(spec.name),
            # topology.conf (and any other generated file) lands in this ConfigMap.
            "configFileRefs": [{"name": config_map_name(spec.name)}],
            "extraConf": "TopologyPlugin=topology/tree",
        },
    }


def accounting_body(spec: ClusterSpec) -> Obj:
    return {
        "apiVersion": ACCOUNTING.api_version,
        "kind": ACCOUNTING.kind,
        "metadata": _meta(f"{spec.name}-accounting", spec.name),
        "spec": {
            "slurmKeyRef": slurm_key_ref(spec.name),
            "jwtKeyRef": jwt_key_ref(spec.name),
            "storageConfig": {
                "host": f"{spec.name}-mariadb",
                "database": f"{spec.name.replace('-', '_')}_acct",
                "username": "slurm",
                "passwordKeyRef": mariadb_password_ref(spec.name),
            },
        },
    }


def loginset_body(spec: ClusterSpec) -> Obj:
    body: Obj = {
        "apiVersion": LOGINSET.api_version,
        "kind": LOGINSET.kind,
        "metadata": _meta(f"{spec.name}-login", spec.name),
        "spec": {
            "controllerRef": {"name": spec.name},
            "replicas": spec.login.count,
            "rootSshAuthorizedKeys": "\n".join(spec.login.ssh_public_keys),
            "sssdConfRef": sssd_conf_ref(spec.name),
        },
    }
    if spec.login.instance_type:
        body["spec"]["template"] = {
            "spec": {"nodeSelector": {"node.kubernetes.io/instance-type": spec.login.instance_type}}
        }
    return body


def home_claim_body(spec: ClusterSpec) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(f"{spec.name}-home", spec.name),
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": f"{spec.shared_home.size}Gi"}},
        },
    }


def nodeset_body(cluster: str, ns: NodeSetSpec) -> Obj:
    """DaemonSet mode: one slurmd pod per node of the set's pool (selected by its pool's
    node label), its Slurm name the node's hostname override (the slot)."""
    return {
        "apiVersion": NODESET.api_version,
        "kind": NODESET.kind,
        "metadata": {
            **_meta(nodeset_name(cluster, ns.name), cluster, **{LABEL_NODE_SET: ns.name}),
            "annotations": {ANN_SLOTS: "{}"},
        },
        "spec": {
            "controllerRef": {"name": cluster},
            "scalingMode": "DaemonSet",
            "replicas": 0,
            "partition": {"enabled": True, "config": partition_config(ns.partition)},
            "template": {"spec": {"nodeSelector": pool_node_labels(cluster, ns.name)}},
        },
    }


def partition_config(partition: str) -> str:
    return f"PartitionName={partition} State=UP MaxTime=UNLIMITED"


def pool_node_labels(cluster: str, node_set: str) -> dict[str, str]:
    """The labels a node set's pool puts on its Kubernetes nodes."""
    return {LABEL_CLUSTER: cluster, LABEL_NODE_SET: node_set}


def slurm_user_body(cluster: str, user: UserSpec) -> Obj:
    return {
        "apiVersion": SLURM_USER.api_version,
        "kind": SLURM_USER.kind,
        "metadata": _meta(f"{cluster}-{user.name}", cluster),
        "spec": {
            "clusterReference": cluster,
            "fullName": user.name,
            "sshPublicKeys": list(user.ssh_public_keys),
            # Ours (UNCONFIRMED): SlurmUser manages only the OS identity (§1.5).
            "slurmAccount": user.slurm_account,
        },
    }


def config_map_body(cluster: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(config_map_name(cluster), cluster),
        "data": data,
    }


def slots_of(nodeset: Obj) -> dict[str, Any]:
    """A NodeSet's slot ledger: `{node: {"vm": id, "attempt": n}}`."""
    raw = (nodeset.get("metadata", {}).get("annotations") or {}).get(ANN_SLOTS) or "{}"
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def resource_version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


class KubeObjects:
    """The objects of one namespace (and the cluster's nodes), as raw JSON.

    Errors are the client's `ApiException`; `get_*` answer None for 404, `delete_*` False.
    """

    def __init__(self, api: client.ApiClient, namespace: str, *, timeout_s: float = 30) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self._timeout = timeout_s

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        resp = await asyncio.to_thread(
            fn, *args, _request_timeout=self._timeout, _preload_content=False, **kwargs
        )
        try:
            body = json.loads(resp.data or b"{}")
        except ValueError as e:
            raise Unavailable("Kubernetes API", f"an answer that is not JSON ({e})") from None
        if not isinstance(body, dict):
            raise Unavailable("Kubernetes API", f"an answer that is not an object: {body!r:.80}")
        return body

    async def _maybe(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj | None:
        try:
            return await self._call(fn, *args, **kwargs)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # --- custom resources ------------------------------------------------------------------

    def _where(self, kind: CustomKind) -> tuple[str, str, str, str]:
        return kind.group, kind.version, self.namespace, kind.plural

    async def create(self, kind: CustomKind, body: Obj) -> tuple[Obj, bool]:
        """Create, or read the one of that name (409): `(object, created)`."""
        try:
            made = await self._call(
                self._custom.create_namespaced_custom_object, *self._where(kind), body
            )
            return made, True
        except ApiException as e:
            if e.status != 409:
                raise
        found = await self.get(kind, body["metadata"]["name"])
        if found is None:  # deleted between the 409 and the read: the caller retries
            raise ApiException(status=409, reason=f"{kind.kind} changed while it was created")
        return found, False

    async def get(self, kind: CustomKind, name: str) -> Obj | None:
        return await self._maybe(
            self._custom.get_namespaced_custom_object, *self._where(kind), name
        )

    async def list(self, kind: CustomKind, label_selector: str) -> list[Obj]:
        body = await self._call(
            self._custom.list_namespaced_custom_object,
            *self._where(kind),
            label_selector=label_selector,
        )
        items = body.get("items")
        if not isinstance(items, list):
            # A list answer without its items says nothing: not "none of that kind".
            raise Unavailable("Kubernetes API", f"a {kind.kind} list without items")
        return list(items)

    async def patch(self, kind: CustomKind, name: str, patch: Obj) -> Obj:
        """A merge patch; with `metadata.resourceVersion` in it, 409 if someone wrote first."""
        return await self._call(
            self._custom.patch_namespaced_custom_object, *self._where(kind), name, patch
        )

    async def delete(self, kind: CustomKind, name: str) -> bool:
        gone = await self._maybe(
            self._custom.delete_namespaced_custom_object, *self._where(kind), name
        )
        return gone is not None

    # --- core objects ----------------------------------------------------------------------

    async def ensure_namespace(self) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        try:
            await self._call(self._core.create_namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise

    async def put_config_map(self, body: Obj) -> None:
        """Create the ConfigMap, or replace its data (idempotent)."""
        name = body["metadata"]["name"]
        try:
            await self._call(self._core.create_namespaced_config_map, self.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise
            await self._call(
                self._core.patch_namespaced_config_map, name, self.namespace, {"data": body["data"]}
            )

    async def ensure_secret(self, body: Obj) -> bool:
        """Create the Secret unless one of that name is there (a key already handed out is
        never replaced: the daemons hold it). True: created now."""
        try:
            await self._call(self._core.create_namespaced_secret, self.namespace, body)
        except ApiException as e:
            if e.status != 409:
                raise
            return False
        return True

    async def delete_secret(self, name: str) -> bool:
        gone = await self._maybe(self._core.delete_namespaced_secret, name, self.namespace)
        return gone is not None

    async def get_config_map(self, name: str) -> Obj | None:
        return await self._maybe(self._core.read_namespaced_config_map, name, self.namespace)

    async def delete_config_map(self, name: str) -> bool:
        gone = await self._maybe(self._core.delete_namespaced_config_map, name, self.namespace)
        return gone is not None

    async def create_claim(self, body: Obj) -> Obj:
        try:
            return await self._call(
                self._core.create_namespaced_persistent_volume_claim, self.namespace, body
            )
        except ApiException as e:
            if e.status != 409:
                raise
        found = await self.get_claim(body["metadata"]["name"])
        if found is None:
            raise ApiException(status=409, reason="the claim changed while it was created")
        return found

    async def get_claim(self, name: str) -> Obj | None:
        return await self._maybe(
            self._core.read_namespaced_persistent_volume_claim, name, self.namespace
        )

    async def delete_claim(self, name: str) -> bool:
        gone = await self._maybe(
            self._core.delete_namespaced_persistent_volume_claim, name, self.namespace
        )
        return gone is not None

    async def get_node(self, name: str) -> Obj | None:
        return await self._maybe(self._core.read_node, name)

    async def patch_node(self, name: str, patch: Obj) -> Obj:
        return await self._call(self._core.patch_node, name, patch)
