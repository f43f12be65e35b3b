"""The inference gateway's retries: what a dropped connection does to a replica."""

from __future__ import annotations

import httpx

from autoclusters.sandbox.inference.gateway import Backend, Gateway
from autoclusters.sandbox.inference.pods import Access


def _gateway(*ports: int) -> Gateway:
    gw = Gateway(Access(url="http://127.0.0.1:1", token="unused"), queue_timeout_s=2)
    for port in ports:
        gw.backends[(f"inference/p{port}", port)] = Backend(
            pod=f"inference/p{port}", node=f"gpu-{port}", port=port, slots=4
        )
    return gw


async def test_a_dropped_kept_alive_connection_is_retried_and_the_replica_kept() -> None:
    seen: list[int | None] = []

    def replica(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.port)
        if len(seen) == 1:  # the replica closed the idle connection as it was reused
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return httpx.Response(200, json={"node": "gpu-1"})

    gw = _gateway(1001)
    async with httpx.AsyncClient(transport=httpx.MockTransport(replica)) as http:
        code, doc = await gw.infer(http, b"{}")
    assert (code, doc) == (200, {"node": "gpu-1"})
    assert seen == [1001, 1001]
    assert [b.pod for b in gw.routable()] == ["inference/p1001"]


async def test_a_replica_that_refuses_connections_is_dropped_and_the_request_served_elsewhere() -> (
    None
):
    def replicas(request: httpx.Request) -> httpx.Response:
        if request.url.port == 1001:
            raise httpx.ConnectError("Connection refused", request=request)
        return httpx.Response(200, json={"node": "gpu-2"})

    gw = _gateway(1001, 1002)
    async with httpx.AsyncClient(transport=httpx.MockTransport(replicas)) as http:
        results = [await gw.infer(http, b"{}") for _ in range(3)]
    assert results == [(200, {"node": "gpu-2"})] * 3
    assert [b.pod for b in gw.routable()] == ["inference/p1002"]


async def test_a_draining_replica_is_not_used_again() -> None:
    calls: list[int | None] = []

    def replicas(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.port)
        if request.url.port == 1001:
            return httpx.Response(503, json={"error": "draining"})
        return httpx.Response(200, json={"node": "gpu-2"})

    gw = _gateway(1001, 1002)
    async with httpx.AsyncClient(transport=httpx.MockTransport(replicas)) as http:
        results = [await gw.infer(http, b"{}") for _ in range(3)]
    assert results == [(200, {"node": "gpu-2"})] * 3
    assert calls.count(1001) == 1
