"""A person's decision from the CLI travels through the API with their own operator token
(AUTOCLUSTERS_API_TOKEN): the API knows who they are from it and signs the proof the worker
checks. The CLI signs nothing and names nobody, so reaching Temporal is not enough. So go
`approve`/`reject` (an incident's step), `breaker reset` and `share approve|reject` (a
sharing workflow's move)."""

from __future__ import annotations

from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from autoclusters.core.guard import BreakerStatus
from autoclusters.core.models import ApprovalRecord
from autoclusters.core.settings import Settings
from autoclusters.core.sharing import MoveDecided

M = TypeVar("M", bound=BaseModel)


class DecisionError(Exception):
    """The API said no, or could not be asked; `code` is the CLI's exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class NotTripped(DecisionError):
    """`breaker reset`: the breaker was not tripped; nothing to reset."""


def post_decision(
    s: Settings, incident_id: str, approve: bool, comment: str, step: str | None
) -> ApprovalRecord:
    path = f"/v1/incidents/{quote(incident_id, safe='')}/decisions"
    body: dict[str, Any] = {"approve": approve, "comment": comment, "step": step}
    return _post(s, path, body, ApprovalRecord)


def post_breaker_reset(s: Settings, cluster: str | None) -> BreakerStatus:
    """Reset the cluster's tripped breaker as the token's person; NotTripped when it is not
    tripped (the CLI says so, exit 0)."""
    return _post(s, "/v1/breaker/reset", {"cluster": cluster}, BreakerStatus)


def post_move_decision(
    s: Settings, move_id: str, approve: bool, cluster: str | None
) -> MoveDecided:
    path = f"/v1/moves/{quote(move_id, safe='')}/decisions"
    return _post(s, path, {"approve": approve, "cluster": cluster}, MoveDecided)


def _post(s: Settings, path: str, body: dict[str, Any], answer: type[M]) -> M:
    if s.api_token is None:
        raise DecisionError(
            "no operator token: set AUTOCLUSTERS_API_TOKEN to your own (api_tokens, role "
            "operator; `autoclusters api token --role operator --name <you>` makes one)",
            2,
        )
    headers = {"Authorization": f"Bearer {s.api_token.get_secret_value()}"}
    try:
        r = httpx.post(f"{s.api_base_url()}{path}", json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise DecisionError(f"cannot reach the API at {s.api_base_url()}: {e}", 1) from None
    if r.status_code == 200:
        return answer.model_validate_json(r.content)
    error = ""
    try:
        said = r.json()
        detail, error = str(said.get("detail", r.text)), str(said.get("error", ""))
    except (ValueError, AttributeError):
        detail = r.text
    if r.status_code == 409 and error == "not tripped":
        raise NotTripped(detail, 0)
    # 409: the workflow refused it; 404: no such incident (or guard); 401/403: the token.
    code = {409: 3, 404: 1, 401: 2, 403: 2}.get(r.status_code, 1)
    raise DecisionError(f"{r.status_code}: {detail}", code)
