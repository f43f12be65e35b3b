"""Bearer tokens for writes: checked before the body is read, so a refused caller learns
nothing about the payload and starts nothing."""

from __future__ import annotations

import hmac

from autoclusters.clients.web.settings import ApiSettings


class Unauthorized(Exception):
    pass


class BearerAuth:
    def __init__(self, settings: ApiSettings) -> None:
        self._tokens = [(t.encode(), name) for t, name in settings.token_names().items()]

    @property
    def configured(self) -> bool:
        return bool(self._tokens)

    def caller(self, authorization: str | None) -> str:
        """The caller's name for a valid `Authorization: Bearer <token>`; else Unauthorized."""
        if not self._tokens:
            raise Unauthorized("no API tokens are configured (api_tokens): writes are disabled")
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        given = token.strip().encode()
        found = ""
        for known, name in self._tokens:  # compare with every token: no early exit
            if hmac.compare_digest(given, known):
                found = name
        if not found:
            raise Unauthorized("invalid bearer token")
        return found
