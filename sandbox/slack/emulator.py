"""A local Slack Web API and interactivity source, for the sandbox and the tests.

The real `slack_sdk` client talks to it over HTTP (`AsyncWebClient(base_url=<url>/api/)`).
It answers as Slack does: HTTP 200 with `{"ok": true, ...}` or `{"ok": false, "error":
"invalid_auth" | "not_authed" | "channel_not_found" | "message_not_found" | ...}`, and
HTTP 429 `{"ok": false, "error": "ratelimited"}` with `Retry-After` when told to. Methods:
auth.test, chat.postMessage, chat.update, chat.postEphemeral, conversations.history
(newest first, message metadata with include_all_metadata), conversations.replies,
usergroups.users.list. Arguments come as JSON, form or query, the token as
`Authorization: Bearer` or a `token` argument, as the SDK sends them.

Controls live beside the API under `/_emulator` (no auth; the server binds loopback):
  POST /_emulator/faults {"method", "count", "status", "error", "retry_after", "delay_s"}
       the next `count` calls of `method` (None: any; count None: until cleared) fail so
  DELETE /_emulator/faults                     end every injected fault (an outage too)
  GET|DELETE /_emulator/requests               the API calls seen, with their answers
  GET /_emulator/channels/{name or id}         messages with their thread replies, and
                                               the ephemeral messages, in order
  PUT /_emulator/usergroups/{id} {"users"}     set a user group's members
  PUT /_emulator/config {"interactivity_url"}  where clicks are sent
  POST /_emulator/click {"incident_id", "action": "approve"|"reject", "user"}
       clicks that button on the message carrying the incident's buttons: a signed
       block_actions payload POSTed to the interactivity URL, as Slack would; answers
       {"status", "body", "message_ts"} with what the endpoint answered
  POST /_emulator/response_url/{n}             records what an app posts to a response_url

    python -m sandbox.slack.emulator --port 8790 --token xoxb-sandbox --signing-secret S \
        --interactivity-url http://127.0.0.1:8000/slack/interactions
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from slack_sdk.signature import SignatureVerifier

from autoclusters.clients.web.quiet_server import serve
from autoclusters.sandbox.slack.workspace import ApiError, Fault, Workspace, WorkspaceConfig

__all__ = ["ClickRequest", "EmulatorConfig", "Fault", "create_app", "main"]

EmulatorConfig = WorkspaceConfig


class ClickRequest(BaseModel):
    incident_id: str
    action: Literal["approve", "reject"]
    user: str
    timestamp_offset_s: int = 0  # sign as if sent that long ago (< 0) or ahead (> 0)


class InteractivityConfig(BaseModel):
    interactivity_url: str | None = None


class Members(BaseModel):
    users: list[str] = Field(default_factory=list)


def create_app(config: EmulatorConfig) -> FastAPI:
    """The emulator as an ASGI app; its state is `app.state.workspace`."""
    app = FastAPI(title="Slack Web API emulator")
    ws = Workspace(config)
    app.state.workspace = ws

    @app.api_route("/api/{method}", methods=["GET", "POST"])
    async def api(method: str, request: Request) -> Response:
        args = await _arguments(request)
        fault = ws.take_fault(method)
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.status == 429:
                ws.record(method, args, 429, "ratelimited")
                headers = {"Retry-After": str(fault.retry_after or 1)}
                body = {"ok": False, "error": "ratelimited"}
                return JSONResponse(body, status_code=429, headers=headers)
            if fault.status >= 500:
                ws.record(method, args, fault.status, "server_error")
                # Slack's edge answers outages with HTML, not JSON.
                html = "<html><body>Service Unavailable</body></html>"
                return Response(html, status_code=fault.status, media_type="text/html")
            if fault.error:
                ws.record(method, args, 200, fault.error)
                return JSONResponse({"ok": False, "error": fault.error})
        try:
            ws.authenticate(_token(request, args))
            result = ws.call(method, args)
        except ApiError as e:
            ws.record(method, args, 200, e.error)
            return JSONResponse({"ok": False, "error": e.error})
        ws.record(method, args, 200, None)
        return JSONResponse({"ok": True, **result})

    @app.get("/_emulator/health")
    async def health() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/_emulator/faults")
    async def add_fault(fault: Fault) -> dict[str, Any]:
        ws.faults.append(fault)
        return {"ok": True, "faults": len(ws.faults)}

    @app.delete("/_emulator/faults")
    async def clear_faults() -> dict[str, bool]:
        ws.faults.clear()
        return {"ok": True}

    @app.get("/_emulator/requests")
    async def requests() -> list[dict[str, Any]]:
        return [c.model_dump() for c in ws.calls]

    @app.delete("/_emulator/requests")
    async def clear_requests() -> dict[str, bool]:
        ws.calls.clear()
        return {"ok": True}

    @app.get("/_emulator/channels/{channel}")
    async def channel(channel: str) -> Response:
        try:
            return JSONResponse(ws.channel_view(channel))
        except ApiError as e:
            return JSONResponse({"ok": False, "error": e.error}, status_code=404)

    @app.put("/_emulator/usergroups/{group_id}")
    async def set_group(group_id: str, members: Members) -> dict[str, bool]:
        ws.config.usergroups[group_id] = list(members.users)
        return {"ok": True}

    @app.put("/_emulator/config")
    async def set_config(body: InteractivityConfig) -> dict[str, bool]:
        ws.config.interactivity_url = body.interactivity_url
        return {"ok": True}

    @app.post("/_emulator/response_url/{n}")
    async def response_url(n: str, request: Request) -> dict[str, bool]:
        ws.response_posts.append({"n": n, "body": (await request.body()).decode()})
        return {"ok": True}

    @app.post("/_emulator/click")
    async def click(req: ClickRequest, request: Request) -> Response:
        return await _click(ws, req, str(request.base_url).rstrip("/"))

    return app


async def _arguments(request: Request) -> dict[str, Any]:
    """The call's arguments wherever the client put them (query, form or JSON body)."""
    args: dict[str, Any] = dict(request.query_params)
    body = await request.body()
    ctype = request.headers.get("content-type", "")
    if body and ctype.startswith("application/json"):
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict):
            args.update(data)
    elif body:
        args.update(parse_qsl(body.decode("utf-8", "replace")))
    return args


def _token(request: Request, args: dict[str, Any]) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    token = args.pop("token", None)
    return str(token) if token else None


async def _click(ws: Workspace, req: ClickRequest, base_url: str) -> Response:
    url = ws.config.interactivity_url
    if not url:
        return JSONResponse({"error": "no interactivity URL configured"}, status_code=409)
    try:
        payload = ws.click_payload(
            incident_id=req.incident_id, action=req.action, user=req.user, base_url=base_url
        )
    except ApiError as e:
        return JSONResponse({"error": e.error}, status_code=404)
    body = urlencode({"payload": json.dumps(payload)}).encode()
    ts = str(int(time.time()) + req.timestamp_offset_s)
    signature = SignatureVerifier(ws.config.signing_secret).generate_signature(
        timestamp=ts, body=body
    )
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": signature or "",
        "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
    }
    try:
        async with httpx.AsyncClient(timeout=30, trust_env=False) as http:
            resp = await http.post(url, content=body, headers=headers)
    except httpx.HTTPError as e:
        return JSONResponse({"error": f"{url}: {type(e).__name__}: {e}"}, status_code=502)
    try:
        answer: Any = resp.json()
    except ValueError:
        answer = resp.text
    message_ts = payload["container"]["message_ts"]
    return JSONResponse({"status": resp.status_code, "body": answer, "message_ts": message_ts})


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise SystemExit(f"{what} must look like KEY=VALUE, not {v!r}")
        out[key] = val
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m sandbox.slack.emulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token", required=True, help="the bot token clients must present")
    ap.add_argument("--signing-secret", required=True, help="signs the clicks it sends")
    ap.add_argument("--interactivity-url", default=None, help="where clicks are POSTed")
    ap.add_argument("--channel", action="append", default=[], help="channel name (repeat)")
    ap.add_argument("--user", action="append", default=[], help="U123=alice (repeat)")
    ap.add_argument("--usergroup", action="append", default=[], help="S123=U1,U2 (repeat)")
    args = ap.parse_args(argv)
    groups = _pairs(args.usergroup, "--usergroup")
    config = EmulatorConfig(
        token=args.token,
        signing_secret=args.signing_secret,
        interactivity_url=args.interactivity_url,
        channels=args.channel or ["incidents"],
        users=_pairs(args.user, "--user"),
        usergroups={g: [u for u in m.split(",") if u] for g, m in groups.items()},
    )
    serve(create_app(config), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
