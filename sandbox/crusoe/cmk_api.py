"""CMK clusters on the Crusoe emulator: the cluster endpoints of Crusoe's public API v1
(`/projects/{pid}/kubernetes/clusters`: create, list, get, PATCH, delete, get-credentials)
and their operations (`.../kubernetes/clusters/operations[/{id}]`, as client-go's
KubernetesClusterOperationsApi).

Create, PATCH and delete answer with an async operation (kind "kubernetes_cluster"); while
one runs on a cluster, other mutations of it get 409, as a VM's and a node pool's do. A
create whose operation ends FAILED leaves the cluster STATE_FAILED. Deleting a cluster that
still has node pools is refused with 409 (UNCONFIRMED: the API may instead delete them).

The emulator runs no Kubernetes API per cluster: get-credentials hands out the kubeconfig it
was started with (`--kubeconfig`; in the sandbox, the Kubernetes emulator's), the same for
every cluster, inside Crusoe's KubernetesAuthenticationDetails (`kube_config`, with the
server and CA read from it). Without one it answers 404 saying so.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import yaml
from fastapi import Request
from pydantic import BaseModel, ValidationError

from autoclusters.sandbox.crusoe.cmk_models import (
    AUTOCLUSTERS_ADD_ON,
    CmkClusterCreate,
    CmkClusterPatch,
)
from autoclusters.sandbox.crusoe.controls import ApiError, operations_of
from autoclusters.sandbox.crusoe.route_table import Handlers
from autoclusters.sandbox.crusoe.world import Cluster, Engine, Operation, now_rfc3339

__all__ = ["cmk_router"]

C = "/projects/{project_id}/kubernetes/clusters"
RUNNING = "STATE_RUNNING"
AUTH_TYPES = ("admin_cert", "oidc")

M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], body: object) -> M:
    """The body as `model`, or 400 naming the first bad field."""
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, "bad_request", f"{where}: {first['msg']}") from None


async def _body(request: Request) -> object:
    if not await request.body():
        return {}  # a PATCH or POST without a body asks for nothing
    try:
        return await request.json()
    except ValueError:
        raise ApiError(400, "bad_request", "the request body is not JSON") from None


def credentials(cluster: Cluster, kubeconfig: str) -> dict[str, str]:
    """Crusoe's KubernetesAuthenticationDetails around a kubeconfig: the address, CA and
    user of its current context (empty where the kubeconfig does not say)."""
    address = ca = user = ""
    try:
        doc = yaml.safe_load(kubeconfig) or {}
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
        server = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        address, user = str(server.get("server", "")), str(ctx.get("user", ""))
        if server.get("certificate-authority-data"):
            ca = base64.b64decode(server["certificate-authority-data"]).decode()
    except (yaml.YAMLError, KeyError, StopIteration, TypeError, binascii.Error, ValueError):
        pass  # the kubeconfig itself still goes out: it is what a client uses
    return {
        "cluster_name": cluster.name,
        "cluster_address": address,
        "cluster_ca_certificate": ca,
        "user_name": user,
        "user_client_certificate": "",
        "user_client_key": "",
        "kube_config": kubeconfig,
    }


def cmk_router(engine: Engine, router: Handlers) -> Handlers:
    """Write the endpoints, closures over `engine`, into `router` (sandbox.crusoe.route_table)."""
    world = engine.world

    def project(project_id: str) -> None:
        if project_id != engine.config.project_id:
            raise ApiError(404, "not_found", f"project {project_id} not found")

    def mine(cluster: Cluster, project_id: str) -> bool:
        # A cluster seeded or saved before clusters had a project is the one project's.
        return cluster.project_id in ("", project_id)

    def cluster_or_404(project_id: str, cluster_id: str) -> Cluster:
        project(project_id)
        cluster = world.clusters.get(cluster_id)
        if cluster is None or not mine(cluster, project_id):
            raise ApiError(404, "not_found", f"Kubernetes cluster {cluster_id} not found")
        return cluster

    def not_busy(cluster: Cluster) -> None:
        if cluster.id in engine.busy:
            raise ApiError(
                409,
                "conflict",
                f"operation {engine.busy[cluster.id]} is in progress on Kubernetes cluster "
                f"{cluster.id}",
            )

    def public(cluster: Cluster) -> dict[str, Any]:
        pools = [p.id for p in world.pools.values() if p.cluster_id == cluster.id]
        return cluster.public(sorted(pools))

    def start(
        cluster: Cluster,
        action: str,
        work: Callable[[], Awaitable[None]],
        on_failed: Callable[[], None],
    ) -> dict[str, Any]:
        async def run(op: Operation) -> None:
            await work()

        def failed(op: Operation) -> None:
            on_failed()  # the engine saves the world after this

        op = engine.start(
            "kubernetes_cluster",
            cluster.id,
            run,
            {"cluster_id": cluster.id, "action": action},
            resource_name=cluster.name,
            on_failed=failed,
        )
        return {"operation": op.public()}

    # Operations first: `/operations` would match `{cluster_id}` too.
    @router.get(C + "/operations")
    async def list_operations(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)
        return operations_of(world, request, "kubernetes_cluster")

    @router.get(C + "/operations/{op_id}")
    async def get_operation(project_id: str, op_id: str) -> dict[str, Any]:
        project(project_id)
        op = world.operations.get(op_id)
        if op is None or op.kind != "kubernetes_cluster":
            raise ApiError(404, "not_found", f"operation {op_id} not found")
        return op.public()

    @router.get(C)
    async def list_clusters(project_id: str) -> dict[str, Any]:
        project(project_id)
        clusters = sorted(
            (c for c in world.clusters.values() if mine(c, project_id)),
            key=lambda c: c.created_at,
        )
        return {"items": [public(c) for c in clusters]}

    @router.post(C)
    async def create_cluster(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)
        spec = _parse(CmkClusterCreate, await _body(request))
        for other in world.clusters.values():
            if mine(other, project_id) and other.name == spec.name:
                raise ApiError(
                    409,
                    "already_exists",
                    f"a Kubernetes cluster named {spec.name} already exists: {other.id}",
                )
        cluster = Cluster(
            **spec.model_dump(),
            project_id=project_id,
            state="STATE_PROVISIONING",
            autoclusters=AUTOCLUSTERS_ADD_ON in spec.add_ons,
        )
        world.clusters[cluster.id] = cluster

        async def work() -> None:
            cluster.state = RUNNING

        def failed() -> None:
            cluster.state = "STATE_FAILED"

        return start(cluster, "CREATE", work, failed)

    @router.get(C + "/{cluster_id}")
    async def get_cluster(project_id: str, cluster_id: str) -> dict[str, Any]:
        return public(cluster_or_404(project_id, cluster_id))

    @router.patch(C + "/{cluster_id}")
    async def patch_cluster(project_id: str, cluster_id: str, request: Request) -> dict[str, Any]:
        cluster = cluster_or_404(project_id, cluster_id)
        changes = _parse(CmkClusterPatch, await _body(request))
        not_busy(cluster)
        if cluster.state != RUNNING:
            raise ApiError(409, "conflict", f"Kubernetes cluster {cluster.id} is {cluster.state}")

        async def work() -> None:
            for field, value in changes.model_dump(exclude_none=True).items():
                setattr(cluster, field, dict(value))
            cluster.updated_at = now_rfc3339()

        return start(cluster, "UPDATE", work, lambda: None)

    @router.delete(C + "/{cluster_id}")
    async def delete_cluster(project_id: str, cluster_id: str) -> dict[str, Any]:
        cluster = cluster_or_404(project_id, cluster_id)
        not_busy(cluster)
        pools = sorted(p.name or p.id for p in world.pools.values() if p.cluster_id == cluster.id)
        if pools:
            raise ApiError(
                409,
                "conflict",
                f"Kubernetes cluster {cluster.id} still has node pools ({', '.join(pools)}): "
                f"delete them first",
            )
        before = cluster.state
        cluster.state = "STATE_DELETING"

        async def work() -> None:
            world.clusters.pop(cluster.id, None)

        def failed() -> None:
            cluster.state = before

        return start(cluster, "DELETE", work, failed)

    @router.post(C + "/{cluster_id}/get-credentials")
    async def get_credentials(
        project_id: str, cluster_id: str, auth_type: str | None = None
    ) -> dict[str, str]:
        cluster = cluster_or_404(project_id, cluster_id)
        if auth_type is not None and auth_type not in AUTH_TYPES:
            raise ApiError(
                400, "bad_request", f"auth_type: expected one of {', '.join(AUTH_TYPES)}"
            )
        if cluster.state != RUNNING:
            raise ApiError(409, "conflict", f"Kubernetes cluster {cluster.id} is {cluster.state}")
        path = engine.config.kubeconfig
        if path is None:
            raise ApiError(
                404,
                "not_found",
                f"no credentials for Kubernetes cluster {cluster.id}: this Crusoe emulator "
                f"was started without --kubeconfig, so it has no Kubernetes API to hand out",
            )
        try:
            kubeconfig = path.read_text()
        except OSError as e:
            # The Kubernetes emulator writes it when it starts: it may not be there yet.
            raise ApiError(
                409,
                "conflict",
                f"the kubeconfig of Kubernetes cluster {cluster.id} cannot be read yet "
                f"({path}: {e.strerror})",
            ) from None
        return credentials(cluster, kubeconfig)

    return router
