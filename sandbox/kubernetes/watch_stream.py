"""A watch over HTTP: `GET <list path>?watch=true` as the API server streams it.

The answer is a chunked `application/json` body of one JSON event per line,
`{"type": "ADDED"|"MODIFIED"|"DELETED"|"ERROR", "object": ...}`, each object filtered by
the request's namespace and label/field selectors, and printed as a one-row Table when the
client asks for Tables (`kubectl get -w`). The stream ends after `timeoutSeconds` (the API
server's default is 30-60 minutes) or when the client goes away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from autoclusters.sandbox.kubernetes.objects import ApiError, Kind
from autoclusters.sandbox.kubernetes.store import Store
from autoclusters.sandbox.kubernetes.table import table, wanted_table
from autoclusters.sandbox.kubernetes.watch import Event, Expired

DEFAULT_TIMEOUT_S = 1800.0
# How often an idle watch checks that its client is still there.
_IDLE_CHECK_S = 1.0


def watch_response(store: Store, request: Request, kind: Kind, ns: str | None) -> StreamingResponse:
    q = request.query_params
    keep = store.matcher(kind, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""))
    version = wanted_table(request.headers.get("accept", ""))
    include = q.get("includeObject", "Metadata")
    timeout_s = float(q.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
    loop = asyncio.get_running_loop()

    def frame(event_type: str, obj: object) -> bytes:
        return (json.dumps({"type": event_type, "object": obj}) + "\n").encode()

    def as_sent(event: Event) -> bytes:
        obj = table(kind.resource, event.obj, version, include) if version else event.obj
        return frame(event.type, obj)

    try:
        initial, sub = store.watch(kind, q.get("resourceVersion", ""), loop)
    except Expired as e:
        gone = ApiError(410, "Expired", str(e)).status()

        async def expired() -> AsyncIterator[bytes]:
            yield frame("ERROR", gone)

        return StreamingResponse(expired(), media_type="application/json")

    async def events() -> AsyncIterator[bytes]:
        try:
            deadline = loop.time() + timeout_s
            for first in initial:
                if keep(first.obj):
                    yield as_sent(first)
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(sub.queue.get(), min(left, _IDLE_CHECK_S))
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                if event is None:
                    return
                if keep(event.obj):
                    yield as_sent(event)
        finally:
            store.unwatch(sub)

    return StreamingResponse(events(), media_type="application/json")
