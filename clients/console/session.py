"""Who may see the console: a reader's or operator's API token, or a session cookie it was
traded for (an agent's or Alertmanager's token opens nothing here).

A login posts the token once; the answer sets `autoclusters_console`, an HttpOnly,
SameSite=Strict cookie holding the caller's name and an expiry, signed with HMAC-SHA256.
The signing key is derived from the server secret *and the caller's current token* (its
SHA-256, all the API keeps), so rotating a token (or restarting an API without
`[console] secret`) ends its sessions.

Nothing is served without one of the two, except to a loopback caller when the API itself
binds a loopback address and `[console] loopback_open` says so (a sandbox on one machine).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

from fastapi import Request

from autoclusters.clients.web.auth import BearerAuth, Forbidden, Unauthorized
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.clients.web.tokens import ROUTES
from autoclusters.core.net import is_loopback

COOKIE = "autoclusters_console"
COOKIE_PATH = "/ui"


class NotLoggedIn(Exception):
    """No valid cookie or bearer token: the caller gets 401 (and, for a page, the login)."""


class Sessions:
    """Signs and checks console session cookies for one API process."""

    def __init__(
        self, settings: ApiSettings, auth: BearerAuth, *, now: float | None = None
    ) -> None:
        secret = settings.console.secret
        self._secret = secret.get_secret_value().encode() if secret else secrets.token_bytes(32)
        # caller -> the SHA-256 of its token, for the roles that may see the console
        self._digests = {
            name: d for d, name, role in settings.grant_digests() if role in ROUTES["console"]
        }
        self._auth = auth
        self._lifetime_s = settings.console.session_s
        self._open = settings.console.loopback_open and is_loopback(settings.api_host)
        self._fixed_now = now  # tests

    @property
    def configured(self) -> bool:
        """Whether any token can log in (no api_tokens: nobody can)."""
        return self._auth.configured

    @property
    def lifetime_s(self) -> int:
        return self._lifetime_s

    def _now(self) -> float:
        return self._fixed_now if self._fixed_now is not None else time.time()

    def _key(self, caller: str) -> bytes | None:
        token = self._digests.get(caller)
        if token is None:
            return None
        return hmac.new(self._secret, token, hashlib.sha256).digest()

    def login(self, token: str) -> tuple[str, str]:
        """The caller's name and a fresh cookie value for a valid token; else Unauthorized."""
        try:
            caller = self._auth.allowed(f"Bearer {token}", "console").name
        except Forbidden as e:
            raise Unauthorized(str(e)) from None
        return caller, self.issue(caller)

    def issue(self, caller: str) -> str:
        key = self._key(caller)
        assert key is not None, "a session for a caller without a token"
        name = base64.urlsafe_b64encode(caller.encode()).decode().rstrip("=")
        body = f"{name}.{int(self._now()) + self._lifetime_s}"
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        return f"{body}.{mac}"

    def check_cookie(self, value: str) -> str:
        """The caller a cookie was issued to; NotLoggedIn if forged, expired or revoked."""
        try:
            name, expires, mac = value.split(".")
            caller = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
            until = int(expires)
        except (ValueError, UnicodeDecodeError):
            raise NotLoggedIn("malformed session") from None
        key = self._key(caller)
        good = hmac.new(key or b"-", f"{name}.{expires}".encode(), hashlib.sha256).hexdigest()
        if key is None or not hmac.compare_digest(good, mac):
            raise NotLoggedIn("invalid session")
        if until < self._now():
            raise NotLoggedIn("session expired")
        return caller

    def caller(self, request: Request) -> str:
        """Who is asking: by bearer header, by cookie, or `loopback` where that is open."""
        header = request.headers.get("authorization")
        if header:
            try:
                return self._auth.allowed(header, "console").name
            except (Unauthorized, Forbidden) as e:
                raise NotLoggedIn(str(e)) from None
        cookie = request.cookies.get(COOKIE)
        why = "log in with the API's bearer token"
        if cookie:
            try:
                return self.check_cookie(cookie)
            except NotLoggedIn as e:
                why = str(e)
        if self._open and is_loopback(request.client.host if request.client else None):
            return "loopback"
        raise NotLoggedIn(why)
