"""The provider's ticket desk, played in the sandbox: it receives AutoClusters' hand-offs
(docs/handoff.md), verifies them as a provider would, opens one ticket per idempotency key,
and answers them through the API when told to (`autoclusters sandbox ticket answer`).

  POST /tickets                  a hand-off: 401 a signature that does not hold, 400 no
                                 Idempotency-Key, 422 not a hand-off; 200 {"ticket",
                                 "duplicate"} (a key seen before: the same ticket, nothing
                                 new opened). Every verified delivery is counted.
Controls (no auth; the desk binds loopback):
  GET  /_desk/tickets            every ticket: key, ticket, deliveries, the request, answers
  POST /_desk/faults {"status", "count"}  the next `count` deliveries answered `status`
                                 (a desk that is away or busy: the sender retries)
  POST /_desk/tickets/{incident_id}/answer {"answer", "note", "new_vm_id", "url"}
                                 sign the answer with the shared secret and POST it to the
                                 ticket's answer_url (or `url`); {"status", "body"} back

    python -m autoclusters.sandbox.crusoe.ticket_desk --port 8795 --secret-file S [--state F]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError

from autoclusters.clients.web.quiet_server import serve
from autoclusters.core.handoff import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    HandoffRequest,
    SignatureRefused,
    signed_headers,
    verify,
)
from autoclusters.core.handoff_answer import HandoffAnswer

__all__ = ["AnswerOrder", "Desk", "create_app", "main"]


class Ticket(BaseModel):
    key: str
    ticket: str
    incident_id: str
    received_at: float
    deliveries: int = 1  # verified POSTs with this key (1 + the sender's retries)
    request: dict[str, Any]
    answers: list[dict[str, Any]] = Field(default_factory=list)


class DeskFault(BaseModel):
    status: int = Field(ge=400, le=599)
    count: int = Field(default=1, ge=1)


class AnswerOrder(HandoffAnswer):
    url: str | None = None  # the API's answer URL; None: the ticket's answer_url


class Desk:
    """The tickets, kept in memory and (with `state`) in a JSON file, so that a restarted
    desk still knows them."""

    def __init__(self, secret: str, state: Path | None = None) -> None:
        self.secret = secret
        self._state = state
        self._lock = threading.Lock()
        self.tickets: dict[str, Ticket] = {}
        self.faults: list[DeskFault] = []
        self.refused = 0  # deliveries whose signature did not hold
        if state is not None and state.exists():
            for t in json.loads(state.read_text()):
                self.tickets[t["key"]] = Ticket.model_validate(t)

    def receive(self, key: str, request: HandoffRequest) -> tuple[Ticket, bool]:
        """The ticket for `key`, and whether it existed (a retry, not a new hand-off)."""
        with self._lock:
            if (seen := self.tickets.get(key)) is not None:
                seen.deliveries += 1
                self._save()
                return seen, True
            t = Ticket(
                key=key,
                ticket=f"TKT-{len(self.tickets) + 1:04d}",
                incident_id=request.incident_id,
                received_at=time.time(),
                request=request.model_dump(mode="json", by_alias=True),
            )
            self.tickets[key] = t
            self._save()
            return t, False

    def by_incident(self, incident_id: str) -> Ticket | None:
        return next((t for t in self.tickets.values() if t.incident_id == incident_id), None)

    def _save(self) -> None:
        if self._state is not None:
            tmp = self._state.with_suffix(".tmp")
            tmp.write_text(json.dumps([t.model_dump() for t in self.tickets.values()]))
            tmp.replace(self._state)


def create_app(desk: Desk) -> FastAPI:
    app = FastAPI(title="AutoClusters sandbox ticket desk")

    @app.post("/tickets")
    async def receive(request: Request) -> JSONResponse:
        raw = await request.body()
        h = request.headers
        try:
            verify(desk.secret, h.get(TIMESTAMP_HEADER), h.get(SIGNATURE_HEADER), raw, time.time())
        except SignatureRefused as e:
            desk.refused += 1
            return JSONResponse({"error": str(e)}, status_code=401)
        key = h.get(IDEMPOTENCY_HEADER, "")
        if not key:
            return JSONResponse({"error": f"no {IDEMPOTENCY_HEADER}"}, status_code=400)
        try:
            req = HandoffRequest.model_validate_json(raw)
        except ValidationError as e:
            return JSONResponse({"error": str(e)}, status_code=422)
        if desk.faults:
            fault = desk.faults[0]
            fault.count -= 1
            if fault.count == 0:
                desk.faults.pop(0)
            return JSONResponse({"error": "injected"}, status_code=fault.status)
        ticket, duplicate = desk.receive(key, req)
        return JSONResponse({"ticket": ticket.ticket, "duplicate": duplicate})

    @app.get("/_desk/tickets")
    async def tickets() -> list[dict[str, Any]]:
        return [t.model_dump() for t in desk.tickets.values()]

    @app.post("/_desk/faults")
    async def fault(f: DeskFault) -> dict[str, bool]:
        desk.faults.append(f)
        return {"ok": True}

    @app.post("/_desk/tickets/{incident_id}/answer")
    async def answer(incident_id: str, order: AnswerOrder) -> JSONResponse:
        t = desk.by_incident(incident_id)
        if t is None:
            return JSONResponse({"error": f"no ticket for {incident_id}"}, status_code=404)
        url = order.url or t.request.get("answer_url") or ""
        if not url:
            return JSONResponse(
                {"error": "the hand-off named no answer_url (the worker's api_public_url)"},
                status_code=409,
            )
        given = HandoffAnswer.model_validate(order.model_dump(exclude={"url"}))
        body = given.model_copy(update={"ticket": given.ticket or t.ticket}).model_dump_json()
        headers = signed_headers(desk.secret, int(time.time()), body.encode())
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(url, content=body.encode(), headers=headers)
        t.answers.append({"answer": given.answer, "status": r.status_code})
        return JSONResponse({"status": r.status_code, "body": _json_or_text(r)})

    return app


def _json_or_text(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--secret-file", type=Path, required=True, help="the shared secret")
    ap.add_argument("--state", type=Path, default=None, help="keep the tickets in this file")
    a = ap.parse_args(argv)
    desk = Desk(a.secret_file.read_text().strip(), a.state)
    serve(create_app(desk), host=a.host, port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
