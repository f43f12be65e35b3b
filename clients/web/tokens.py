"""What each API token may do: a token is a role, never a blanket pass.

`api_tokens` maps a caller's name to a grant:

    {"alertmanager": "<token>"}                                   # named after its role
    {"am-next": {"role": "alertmanager", "token": "<token>"}}      # a second one, rotating
    {"alice": {"role": "operator", "sha256": "<hex of the token>"}}  # a person's, hashed

The roles, and the routes each opens (`ROUTES`; docs/security.md has the table):

    agent         POST /v1/reports, /v1/health-snapshots: a node agent's own reports
    alertmanager  POST /v1/alerts/alertmanager, /v1/alerts/sharing: the webhooks
    reader        GET /v1/incidents..., /metrics, the console
    operator      what a reader may, and decisions (POST /v1/incidents/{id}/decisions):
                  the grant's name is the person, the approver the workflow checks

Every token is kept as its SHA-256 only, so a person's token can be configured without
ever being written down (`autoclusters api token --role operator --name alice` prints
both), and a check compares digests of equal length in constant time. Any number of grants
may share a role: two valid at once is how a token is rotated without a gap.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

Role = Literal["agent", "alertmanager", "reader", "operator"]
ROLES: tuple[Role, ...] = get_args(Role)

# Route group -> the roles that may call it. The route handlers name their group.
Route = Literal["reports", "alerts", "read", "metrics", "decide", "console"]
ROUTES: dict[Route, frozenset[Role]] = {
    "reports": frozenset({"agent"}),
    "alerts": frozenset({"alertmanager"}),
    "read": frozenset({"reader", "operator"}),
    "metrics": frozenset({"reader", "operator"}),
    "decide": frozenset({"operator"}),
    "console": frozenset({"reader", "operator"}),
}

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenGrant(BaseModel):
    """One caller's token (or its SHA-256) and its role."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    token: SecretStr | None = None
    sha256: str | None = None

    @model_validator(mode="after")
    def _one_secret(self) -> TokenGrant:
        if (self.token is None) == (self.sha256 is None):
            raise ValueError("give exactly one of token and sha256")
        if self.token is not None and len(self.token.get_secret_value().strip()) < 16:
            raise ValueError("token: at least 16 characters (autoclusters api token)")
        if self.sha256 is not None and not _HEX64.match(self.sha256):
            raise ValueError("sha256: 64 lowercase hex digits (autoclusters api token)")
        return self

    def digest(self) -> bytes:
        if self.sha256 is not None:
            return bytes.fromhex(self.sha256)
        assert self.token is not None
        return digest(self.token.get_secret_value().strip())


def parse_grants(raw: Any) -> dict[str, TokenGrant]:
    """`api_tokens` as configured: a bare string is a token for the role its name is."""
    if not isinstance(raw, dict):
        raise ValueError("api_tokens: a table of caller name -> token or {role, token|sha256}")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, str):
            if name not in ROLES:
                raise ValueError(
                    f"api_tokens.{name}: a bare token needs a role's name "
                    f"({', '.join(ROLES)}); else write {{role = ..., token = ...}}"
                )
            value = {"role": name, "token": value}
        out[name] = value
    return out  # pydantic validates each value as a TokenGrant
