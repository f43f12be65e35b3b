"""What a write must pass before anything starts, in this order: the token (401, before the
body is read) and its role (403), the body (413, 422), the fault kinds (422), the nodes
(404, or 503 when Slurm's node list cannot be read)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from autoclusters.clients.api.errors import ApiError, Refusals
from autoclusters.clients.api.policy_cache import PolicyCache
from autoclusters.clients.inventory import NodeInventory
from autoclusters.clients.web.auth import BearerAuth, Caller, Forbidden, Unauthorized
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.clients.web.tokens import Route
from autoclusters.core.faults import CATALOGUE_HINT, UnknownFaultError, check_known_fault
from autoclusters.integrations.slurm import SlurmError

M = TypeVar("M", bound=BaseModel)

# Reads while api_auth_reads is off: nobody in particular.
ANONYMOUS = Caller("anonymous", "reader")


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose body `RequestChecks.body` reads: the body is read
    by hand (auth comes first); this keeps it in the OpenAPI document."""
    schema = model.model_json_schema(by_alias=True)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def not_in_cluster(node: str, cluster: str) -> str:
    return f"node {node} is not in cluster {cluster}"


class RequestChecks:
    def __init__(
        self,
        settings: ApiSettings,
        auth: BearerAuth,
        refusals: Refusals,
        inventory: NodeInventory,
        policies: PolicyCache,
    ) -> None:
        self._settings = settings
        self._auth = auth
        self._refusals = refusals
        self._inventory = inventory
        self._policies = policies

    def authorize(self, request: Request, endpoint: str, route: Route) -> Caller:
        """The caller, if their token's role opens `route` (clients/web/tokens.py): 401
        without a valid bearer token, 403 with one of another role. Reads need a token
        only with api_auth_reads."""
        if route == "read" and not self._settings.api_auth_reads:
            return ANONYMOUS
        try:
            return self._auth.allowed(request.headers.get("authorization"), route)
        except Unauthorized as e:
            err = self._refusals.refuse(401, "unauthorized", endpoint, "unauthorized", str(e))
            err.headers["WWW-Authenticate"] = 'Bearer realm="autoclusters"'
            raise err from None
        except Forbidden as e:
            raise self._refusals.refuse(403, "forbidden", endpoint, "forbidden", str(e)) from None

    async def body(self, request: Request, model: type[M], what: str, endpoint: str) -> M:
        """The body as `model`: 413 past api_max_body_bytes, 422 naming each bad field."""
        limit = self._settings.api_max_body_bytes

        def too_large() -> ApiError:
            detail = f"more than {limit} bytes"
            return self._refusals.refuse(413, "too_large", endpoint, "payload too large", detail)

        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large()
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise too_large()
        try:
            return model.model_validate_json(bytes(raw))
        except ValidationError as e:
            raise self._refusals.invalid(e, what, endpoint) from None

    def refuse_unknown_faults(self, faults: list[tuple[str, str]], endpoint: str) -> None:
        """422 naming every unknown fault kind and the field it was in, in one line that
        points at the catalogue (`autoclusters faults`) rather than listing it."""
        known = self._policies.current().faults
        bad = []
        for where, fault in faults:
            try:
                check_known_fault(fault, known)
            except UnknownFaultError:
                bad.append((where, fault))
        if bad:
            kinds = sorted({f for _, f in bad})
            fields = [w for w, _ in bad]
            shown = ", ".join(repr(k[:64]) for k in kinds[:10])
            raise self._refusals.refuse(
                422,
                "unknown_fault",
                endpoint,
                "unknown fault kind",
                f"unknown fault kind {shown} ({', '.join(fields[:10])}): "
                f"{CATALOGUE_HINT}; nothing was started",
                faults=kinds,
                fields=fields,
            )  # fmt: skip

    async def known_nodes(self, names: Iterable[str], endpoint: str) -> set[str]:
        """Those of `names` the inventory knows; 503 when it cannot be read."""
        try:
            return await self._inventory.known(set(names))
        except SlurmError as e:
            raise self._refusals.unavailable(e, endpoint) from None

    def refuse_unknown_nodes(
        self, nodes: list[str], endpoint: str, where: str = "", *, others: int = 0
    ) -> None:
        """404 naming `nodes` (firing, not in the cluster) with api_unknown_node=reject, when
        the request holds nothing else to act on (`others`: its alerts for known nodes and
        its resolved ones). Otherwise (or with `skip`) the caller acts on the others and
        lists these in its 202: Alertmanager does not retry a 4xx, so refusing a payload
        for one unknown node would drop every real node's alert in it. `where`: the alerts
        that named them, for a payload of several."""
        cluster = self._settings.cluster
        if not nodes or others or self._settings.api_unknown_node != "reject":
            return
        if where:
            said = f"node(s) {', '.join(nodes)} not in cluster {cluster} ({where})"
        else:
            [node] = nodes
            said = not_in_cluster(node, cluster)
        raise self._refusals.refuse(
            404, "unknown_node", endpoint, "unknown node", f"{said}; nothing was started",
            nodes=nodes,
        )  # fmt: skip
