"""A person's decision from the CLI travels through the API with their own operator token
(AUTOCLUSTERS_API_TOKEN): the API knows who they are from it and signs the proof the worker
checks. The CLI signs nothing and names nobody, so reaching Temporal is not enough."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from autoclusters.core.models import ApprovalRecord
from autoclusters.core.settings import Settings


class DecisionError(Exception):
    """The API said no, or could not be asked; `code` is the CLI's exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def post_decision(
    s: Settings, incident_id: str, approve: bool, comment: str, step: str | None
) -> ApprovalRecord:
    if s.api_token is None:
        raise DecisionError(
            "no operator token: set AUTOCLUSTERS_API_TOKEN to your own (api_tokens, role "
            "operator; `autoclusters api token --role operator --name <you>` makes one)",
            2,
        )
    url = f"{s.api_base_url()}/v1/incidents/{quote(incident_id, safe='')}/decisions"
    body: dict[str, Any] = {"approve": approve, "comment": comment, "step": step}
    headers = {"Authorization": f"Bearer {s.api_token.get_secret_value()}"}
    try:
        r = httpx.post(url, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise DecisionError(f"cannot reach the API at {s.api_base_url()}: {e}", 1) from None
    if r.status_code == 200:
        return ApprovalRecord.model_validate_json(r.content)
    try:
        detail = str(r.json().get("detail", r.text))
    except ValueError:
        detail = r.text
    # 409: the incident refused it; 404: no such incident; 401/403: the token.
    code = {409: 3, 404: 1, 401: 2, 403: 2}.get(r.status_code, 1)
    raise DecisionError(f"{r.status_code}: {detail}", code)
