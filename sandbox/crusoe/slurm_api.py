"""Managed Slurm on the Crusoe emulator: the cluster endpoints of Crusoe's public API
(`/projects/{pid}/slurm/clusters`) and the emulator-only (EXT, unconfirmed in the public
API) configuration and users endpoints.

Creating, configuring and deleting a cluster are async operations (kind "slurm_cluster");
what they do to real daemons is the backend's business (`SlurmBackend` hooks; a backend
without them only changes the world). Operations on one cluster run one at a time, in the
order they were asked for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from fastapi import Request
from pydantic import BaseModel, ValidationError

from autoclusters.sandbox.crusoe.controls import ApiError, operations_of
from autoclusters.sandbox.crusoe.route_table import Handlers
from autoclusters.sandbox.crusoe.slurm_models import (
    ClusterStarted,
    Issue,
    SlurmCluster,
    SlurmClusterCreate,
    SlurmConfiguration,
    SlurmUser,
)
from autoclusters.sandbox.crusoe.world import (
    Engine,
    Operation,
    SlurmBackend,
    new_id,
    now_rfc3339,
)

__all__ = ["slurm_router"]

C = "/projects/{project_id}/slurm/clusters"


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
    try:
        return await request.json()
    except ValueError:
        raise ApiError(400, "bad_request", "the request body is not JSON") from None


def _hooks(engine: Engine) -> SlurmBackend | None:
    backend = engine.backend
    return cast(SlurmBackend, backend) if hasattr(backend, "on_cluster_create") else None


def slurm_router(engine: Engine, router: Handlers) -> Handlers:
    """Write the endpoints, closures over `engine`, into `router` (sandbox.crusoe.route_table)."""
    world = engine.world

    def project(project_id: str) -> None:
        if project_id != engine.config.project_id:
            raise ApiError(404, "not_found", f"project {project_id} not found")

    def cluster_or_404(project_id: str, cid: str) -> SlurmCluster:
        project(project_id)
        cluster = world.slurm_clusters.get(cid)
        if cluster is None:
            raise ApiError(404, "not_found", f"Slurm cluster {cid} not found")
        return cluster

    def start(
        cluster: SlurmCluster, action: str, work: Callable[[], Awaitable[None]]
    ) -> dict[str, Any]:
        async def run(op: Operation) -> None:
            async with engine.cluster_lock(cluster.id):
                await work()
            op.result = {"slurm_cluster_id": cluster.id}

        op = engine.start(
            "slurm_cluster",
            cluster.id,
            run,
            {"slurm_cluster_id": cluster.id, "action": action},
            resource_name=cluster.name,
            exclusive=False,
        )
        return {"operation": op.public()}

    def apply(cluster: SlurmCluster, started: ClusterStarted) -> None:
        cluster.login_node_endpoint = started.login_node_endpoint
        cluster.accounting_state = started.accounting_state
        cluster.controller_state = started.controller_state

    # Operations first: `/operations` would match `{cluster_id}` too.
    @router.get(C + "/operations")
    async def list_operations(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)
        return operations_of(world, request, "slurm_cluster")

    @router.get(C + "/operations/{op_id}")
    async def get_operation(project_id: str, op_id: str) -> dict[str, Any]:
        project(project_id)
        op = world.operations.get(op_id)
        if op is None or op.kind != "slurm_cluster":
            raise ApiError(404, "not_found", f"operation {op_id} not found")
        return op.public()

    @router.get(C)
    async def list_clusters(project_id: str) -> dict[str, Any]:
        project(project_id)
        mine = [c for c in world.slurm_clusters.values() if c.project_id == project_id]
        return {"items": [c.public() for c in sorted(mine, key=lambda c: c.created_at)]}

    @router.post(C)
    async def create_cluster(project_id: str, request: Request) -> dict[str, Any]:
        project(project_id)
        spec = _parse(SlurmClusterCreate, await _body(request))
        for other in world.slurm_clusters.values():
            if other.project_id == project_id and other.name == spec.name:
                raise ApiError(
                    409,
                    "already_exists",
                    f"a Slurm cluster named {spec.name} already exists: {other.id}",
                )
        cluster = SlurmCluster(
            id=new_id(),
            project_id=project_id,
            created_at=now_rfc3339(),
            **spec.model_dump(),
        )
        world.slurm_clusters[cluster.id] = cluster
        hooks = _hooks(engine)

        async def work() -> None:
            try:
                if hooks is not None:
                    apply(cluster, await hooks.on_cluster_create(cluster.model_copy(deep=True)))
            except Exception as e:
                cluster.state = "STATE_FAILED"
                cluster.issues.append(Issue(code="create_failed", message=str(e)))
                raise
            cluster.state = "STATE_RUNNING"

        return start(cluster, "CREATE", work)

    @router.get(C + "/{cluster_id}")
    async def get_cluster(project_id: str, cluster_id: str) -> dict[str, Any]:
        return cluster_or_404(project_id, cluster_id).public()

    @router.delete(C + "/{cluster_id}")
    async def delete_cluster(project_id: str, cluster_id: str) -> dict[str, Any]:
        cluster = cluster_or_404(project_id, cluster_id)
        cluster.state = "STATE_DELETING"
        hooks = _hooks(engine)

        async def work() -> None:
            if hooks is not None:
                await hooks.on_cluster_delete(cluster.model_copy(deep=True))
            world.slurm_clusters.pop(cluster.id, None)

        return start(cluster, "DELETE", work)

    @router.put(C + "/{cluster_id}/configuration")
    async def configure(project_id: str, cluster_id: str, request: Request) -> dict[str, Any]:
        cluster = cluster_or_404(project_id, cluster_id)
        config = _parse(SlurmConfiguration, await _body(request))
        problems = config.problems()
        if problems:
            field, message = problems[0]
            raise ApiError(400, "bad_request", f"{field}: {message}")
        if cluster.state in ("STATE_DELETING", "STATE_FAILED"):
            raise ApiError(409, "conflict", f"Slurm cluster {cluster.id} is {cluster.state}")
        hooks = _hooks(engine)

        async def work() -> None:
            cluster.configuration = config
            cluster.nodesets = [
                {"name": s.name, "partition": s.partition, "count": len(s.nodes)}
                for s in config.node_sets
            ]
            running = [vm.name for vm in world.vms.values() if vm.state == "RUNNING"]
            if hooks is not None:
                apply(
                    cluster,
                    await hooks.on_cluster_configure(cluster.model_copy(deep=True), running),
                )

        return start(cluster, "CONFIGURE", work)

    @router.post(C + "/{cluster_id}/users")
    async def add_user(project_id: str, cluster_id: str, request: Request) -> dict[str, Any]:
        cluster = cluster_or_404(project_id, cluster_id)
        user = _parse(SlurmUser, await _body(request))
        if cluster.state != "STATE_RUNNING":
            raise ApiError(409, "conflict", f"Slurm cluster {cluster.id} is {cluster.state}")
        hooks = _hooks(engine)
        async with engine.cluster_lock(cluster.id):
            if hooks is not None:
                await hooks.on_cluster_user(cluster.model_copy(deep=True), user)
            cluster.users[user.name] = user
            engine.save()
        return {"name": user.name}

    return router
