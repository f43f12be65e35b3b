"""Bearer tokens: who is calling and whether their role opens this route. Checked before the
body is read, so a refused caller learns nothing about the payload and starts nothing."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from autoclusters.clients.web.settings import ApiSettings
from autoclusters.clients.web.tokens import ROUTES, Role, Route, digest


class Unauthorized(Exception):
    """No valid token (401)."""


class Forbidden(Exception):
    """A valid token whose role does not open the route (403)."""


@dataclass(frozen=True)
class Caller:
    name: str  # the grant's name: for an operator, the person
    role: Role


class BearerAuth:
    def __init__(self, settings: ApiSettings) -> None:
        self._grants = settings.grant_digests()

    @property
    def configured(self) -> bool:
        return bool(self._grants)

    def caller(self, authorization: str | None) -> Caller:
        """Who a valid `Authorization: Bearer <token>` belongs to; else Unauthorized."""
        if not self._grants:
            raise Unauthorized("no API tokens are configured (api_tokens): writes are disabled")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        given = digest(token.strip())
        found: Caller | None = None
        # Compare with every grant, digests of one length: no early exit, no length leak.
        for known, name, role in self._grants:
            if hmac.compare_digest(given, known):
                found = Caller(name, role)
        if found is None:
            raise Unauthorized("invalid bearer token")
        return found

    def allowed(self, authorization: str | None, route: Route) -> Caller:
        """The caller, if their role opens `route`; Unauthorized or Forbidden otherwise."""
        who = self.caller(authorization)
        if who.role not in ROUTES[route]:
            roles = " or ".join(sorted(ROUTES[route]))
            raise Forbidden(f"a {who.role} token may not call this ({roles} only)")
        return who
