"""Alertmanager's v2 API, for maintenance silences: while an incident holds a node, the
node's other alerts (its exporter going away during a reboot, a replacement's DCGM warming
up) are silenced for the people on call, and the silence is lifted when the incident
closes. Every silence has an end time, so one whose lift was lost still expires.

A failed call is `AlertmanagerUnavailable` (refused, 5xx, a body that is not the API's),
never "no silence"; a silence that is gone already (404) is lifted.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx

from autoclusters.core.unavailable import Unavailable
from autoclusters.integrations.tls import default_verify

ALERTMANAGER = "Alertmanager"


class AlertmanagerUnavailable(Unavailable):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(ALERTMANAGER, message)
        self.status = status


def node_matchers(label: str, node: str, *, except_label: str, except_value: str) -> list[Any]:
    """Every alert whose `label` is the node, but those routed to AutoClusters itself (a
    worse fault on the node must still reach the runbook)."""
    return [
        {"name": label, "value": node, "isRegex": False, "isEqual": True},
        {"name": except_label, "value": except_value, "isRegex": False, "isEqual": False},
    ]


class AlertmanagerClient:
    """A plain client of one Alertmanager (`base_url`, e.g. http://alertmanager:9093)."""

    def __init__(self, base_url: str, *, timeout_s: float = 10) -> None:
        self._base = base_url.rstrip("/")
        self._http = httpx.AsyncClient(timeout=timeout_s, verify=default_verify())

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_silence(
        self,
        matchers: list[Any],
        *,
        starts_at: datetime,
        ends_at: datetime,
        created_by: str,
        comment: str,
    ) -> str:
        body = {
            "matchers": matchers,
            "startsAt": starts_at.isoformat(),
            "endsAt": ends_at.isoformat(),
            "createdBy": created_by,
            "comment": comment,
        }
        answer = await self._call("POST", "/api/v2/silences", json=body)
        silence_id = answer.get("silenceID") if isinstance(answer, dict) else None
        if not isinstance(silence_id, str) or not silence_id:
            raise AlertmanagerUnavailable(f"POST /api/v2/silences: no silenceID in {answer!r}")
        return silence_id

    async def silences_on(self, label: str, value: str) -> list[dict[str, Any]]:
        """The silences (any state) with the matcher `label="value"`."""
        answer = await self._call(
            "GET", "/api/v2/silences", params={"filter": f'{label}="{value}"'}
        )
        if not isinstance(answer, list):
            raise AlertmanagerUnavailable(f"GET /api/v2/silences: not a list: {answer!r}"[:300])
        return [s for s in answer if isinstance(s, dict)]

    async def expire_silence(self, silence_id: str) -> None:
        """Lift it now; one that is gone or expired already counts as lifted."""
        await self._call("DELETE", f"/api/v2/silence/{silence_id}", missing_ok=True)

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Any:
        where = f"{method} {path}"
        try:
            resp = await self._http.request(method, self._base + path, json=json, params=params)
        except httpx.HTTPError as e:
            raise AlertmanagerUnavailable(f"{where}: {type(e).__name__}: {e}") from e
        if resp.status_code == 404 and missing_ok:
            return None
        if resp.status_code >= 400:
            raise AlertmanagerUnavailable(
                f"{where}: {resp.status_code} {resp.text.strip()[:200]!r}",
                status=resp.status_code,
            )
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError as e:
            raise AlertmanagerUnavailable(f"{where}: a body that is not JSON") from e
