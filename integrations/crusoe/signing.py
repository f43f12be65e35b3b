"""Crusoe API v1 request signing (HMAC-SHA256), for the client and for the emulator.

The string to sign is four lines, each ending in a newline:

    <path incl. /v1>\\n<canonical query>\\n<VERB>\\n<X-Crusoe-Timestamp value>\\n

keyed with the secret key base64url-decoded (no padding); the signature is base64url
(no padding) and travels as `Authorization: Bearer 1.0:<access key id>:<signature>`.
This follows Crusoe's Go signer (client-go `auth/v1/auth.go`) byte for byte: the canonical
query is parsed like Go's `url.ParseQuery` (pairs split on `&`, a `;` is an error),
sorted by key with values in their original order, and re-encoded with `url.QueryEscape`.
The path is the decoded path (Go's `req.URL.Path`); a path with a malformed escape cannot
be sent at all (Go's URL parser refuses it), the method is signed exactly as sent, and the
secret key is decoded as Go's `base64.RawURLEncoding` does (no `=` padding; CR and LF are
skipped; anything else outside the alphabet is an error).

The emulator checks signatures with its own implementation (sandbox/crusoe/signature.py),
so a mistake here cannot hide behind the same mistake there.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Generator, Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import quote_from_bytes, unquote_to_bytes

import httpx
from pydantic import SecretStr

__all__ = [
    "AUTH_VERSION",
    "TIMESTAMP_HEADER",
    "CrusoeAuth",
    "SignatureError",
    "SigningError",
    "canonical_query",
    "check_raw_path",
    "decode_secret_key",
    "format_timestamp",
    "sign",
    "signature",
    "string_to_sign",
    "verify",
]

TIMESTAMP_HEADER = "X-Crusoe-Timestamp"
AUTH_VERSION = "1.0"

_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


class SigningError(ValueError):
    """The request cannot be signed as Crusoe signs it (bad query, bad secret key)."""


class SignatureError(Exception):
    """A request's signature does not hold; `reason` says why, without any secret."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def format_timestamp(now: datetime | None = None) -> str:
    """RFC 3339 in UTC to the second, as Go's `time.RFC3339` prints it: 2026-03-26T12:00:00Z."""
    now = datetime.now(UTC) if now is None else now.astimezone(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _unescape(part: bytes) -> bytes:
    # Go's QueryUnescape: `+` is a space, `%XX` a byte, and a malformed escape an error.
    if _BAD_ESCAPE.search(part):
        raise SigningError(f"invalid URL escape in query: {part[:40]!r}")
    return unquote_to_bytes(part.replace(b"+", b" "))


def _escape(value: bytes) -> str:
    # Go's QueryEscape keeps only A-Z a-z 0-9 - _ . ~ and writes a space as `+`.
    return quote_from_bytes(value, safe=" ").replace(" ", "+")


def canonical_query(query: str | bytes) -> str:
    """The query as Crusoe signs it: unescaped, sorted by key (stable), re-escaped."""
    raw = query.encode() if isinstance(query, str) else query
    pairs: list[tuple[bytes, bytes]] = []
    for part in raw.split(b"&"):
        if b";" in part:
            raise SigningError("invalid semicolon separator in query")
        if not part:
            continue
        key, _, value = part.partition(b"=")
        pairs.append((_unescape(key), _unescape(value)))
    # sorted() is stable, so the values of a repeated key keep the order they were given in.
    pairs.sort(key=lambda kv: kv[0])
    return "&".join(f"{_escape(k)}={_escape(v)}" for k, v in pairs)


def check_raw_path(raw_path: str | bytes) -> None:
    """A path with a malformed %-escape is not a URL Crusoe's signer would ever send."""
    raw = raw_path.encode() if isinstance(raw_path, str) else raw_path
    if _BAD_ESCAPE.search(raw):
        raise SigningError(f"invalid URL escape in path: {raw[:60]!r}")


def string_to_sign(*, method: str, path: str, query: str | bytes, timestamp: str) -> bytes:
    # The method exactly as sent: HTTP methods are case-sensitive and Go signs req.Method.
    return f"{path}\n{canonical_query(query)}\n{method}\n{timestamp}\n".encode()


def decode_secret_key(secret_key: str) -> bytes:
    # As Go's base64.RawURLEncoding: line breaks are skipped, padding and any other character
    # outside the alphabet are errors. Messages never echo the key itself.
    text = secret_key.replace("\r", "").replace("\n", "")
    if not text or not _BASE64URL.fullmatch(text):
        raise SigningError("the Crusoe secret key is not unpadded base64url")
    if len(text) % 4 == 1:
        raise SigningError("the Crusoe secret key is not unpadded base64url (truncated)")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def signature(payload: bytes, secret_key: str) -> str:
    """base64url (no padding) of HMAC-SHA256(base64url-decoded secret key, payload)."""
    digest = hmac.new(decode_secret_key(secret_key), payload, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(
    *,
    method: str,
    path: str,
    query: str | bytes,
    timestamp: str,
    access_key_id: str,
    secret_key: str,
) -> dict[str, str]:
    """The two headers that authenticate one request."""
    payload = string_to_sign(method=method, path=path, query=query, timestamp=timestamp)
    sig = signature(payload, secret_key)
    return {
        TIMESTAMP_HEADER: timestamp,
        "Authorization": f"Bearer {AUTH_VERSION}:{access_key_id}:{sig}",
    }


def _parse_timestamp(value: str) -> datetime:
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not an RFC 3339 time") from e
    if ts.tzinfo is None:
        raise SignatureError(f"{TIMESTAMP_HEADER} has no time zone")
    return ts


def verify(
    *,
    method: str,
    path: str,
    query: str | bytes,
    headers: Mapping[str, str],
    access_key_id: str,
    secret_key: str,
    max_skew: timedelta = timedelta(minutes=5),
    now: datetime | None = None,
) -> None:
    """Check one request's signature and timestamp; raise SignatureError if either fails.

    The window is symmetric: a timestamp too far in the future is refused like a stale one,
    so a captured request cannot be replayed later.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    timestamp = lowered.get(TIMESTAMP_HEADER.lower())
    auth = lowered.get("authorization")
    if not timestamp or not auth:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or Authorization header")
    scheme, _, token = auth.partition(" ")
    version, _, rest = token.partition(":")
    key_id, _, given = rest.partition(":")
    if scheme != "Bearer" or version != AUTH_VERSION or not key_id or not given:
        raise SignatureError(f"Authorization is not 'Bearer {AUTH_VERSION}:<key id>:<signature>'")
    if not hmac.compare_digest(key_id.encode(), access_key_id.encode()):
        raise SignatureError("unknown access key id")
    skew = _parse_timestamp(timestamp) - (now or datetime.now(UTC))
    if abs(skew) > max_skew:
        raise SignatureError(f"{TIMESTAMP_HEADER} is {skew.total_seconds():+.0f}s off the clock")
    try:
        payload = string_to_sign(method=method, path=path, query=query, timestamp=timestamp)
    except SigningError as e:
        raise SignatureError(str(e)) from e
    expected = signature(payload, secret_key)
    if not hmac.compare_digest(expected.encode(), given.encode()):
        raise SignatureError("signature does not match")


class CrusoeAuth(httpx.Auth):
    """Signs every request an httpx client sends, at send time (so retries get a fresh time)."""

    def __init__(self, access_key_id: str, secret_key: SecretStr) -> None:
        self._access_key_id = access_key_id
        self._secret_key = secret_key

    def __repr__(self) -> str:
        return f"CrusoeAuth(access_key_id={self._access_key_id!r})"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        check_raw_path(request.url.raw_path.split(b"?", 1)[0])
        request.headers.update(
            sign(
                method=request.method,
                path=request.url.path,
                query=request.url.query,
                timestamp=format_timestamp(),
                access_key_id=self._access_key_id,
                secret_key=self._secret_key.get_secret_value(),
            )
        )
        yield request
