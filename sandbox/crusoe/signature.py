"""The Crusoe emulator's own check of a request's signature, written from the public
algorithm (Crusoe's API reference and the Go signer's behaviour), not from our client.

If the client signs wrongly, this refuses it with 401 as the real API would; sharing the
client's code here would hide the bug on both sides.

The algorithm, as the API checks it:

    string to sign = path "\\n" canonical query "\\n" method "\\n" X-Crusoe-Timestamp "\\n"
    key            = base64url-decode(secret key), no padding (CR/LF skipped)
    signature      = base64url(HMAC-SHA256(key, string to sign)), no padding
    Authorization  = "Bearer 1.0:" access key id ":" signature

- path: the request's path, %-decoded; a malformed escape is a bad request;
- canonical query: split on "&" (a ";" is an error, empty pieces are skipped), each piece
  "k=v" (no "=": value empty), "+" is a space, %XX a byte, a malformed escape an error;
  keys sorted bytewise, a repeated key's values in the order given; each key and value
  escaped keeping only A-Z a-z 0-9 - _ . ~ and writing a space as "+";
- method: as received, case-sensitive.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import string
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

UNRESERVED = frozenset((string.ascii_letters + string.digits + "-_.~").encode())
HEX = frozenset(b"0123456789abcdefABCDEF")
B64URL = frozenset((string.ascii_letters + string.digits + "-_").encode())


class Refused(Exception):
    """Why a request does not authenticate (never containing a secret)."""


def _unescape(piece: bytes, *, plus_is_space: bool) -> bytes:
    out = bytearray()
    i = 0
    while i < len(piece):
        c = piece[i]
        if c == ord("%"):
            pair = piece[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= HEX:
                raise Refused(f"malformed %-escape in {piece[:40]!r}")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(ord(" ") if plus_is_space and c == ord("+") else c)
        i += 1
    return bytes(out)


def _escape(value: bytes) -> bytes:
    out = bytearray()
    for c in value:
        if c in UNRESERVED:
            out.append(c)
        elif c == ord(" "):
            out.append(ord("+"))
        else:
            out += b"%%%02X" % c
    return bytes(out)


def canonical(raw_query: bytes) -> bytes:
    values: dict[bytes, list[bytes]] = {}
    for piece in raw_query.split(b"&"):
        if b";" in piece:
            raise Refused("';' in the query")
        if not piece:
            continue
        k, _, v = piece.partition(b"=")
        values.setdefault(_unescape(k, plus_is_space=True), []).append(
            _unescape(v, plus_is_space=True)
        )
    return b"&".join(_escape(k) + b"=" + _escape(v) for k in sorted(values) for v in values[k])


def decode_key(secret: str) -> bytes:
    raw = secret.encode().replace(b"\r", b"").replace(b"\n", b"")
    if not raw or not set(raw) <= B64URL or len(raw) % 4 == 1:
        raise Refused("the emulator's secret key is not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))
    except binascii.Error as e:
        raise Refused("the emulator's secret key is not unpadded base64url") from e


def expected_signature(
    *, method: str, raw_path: bytes, raw_query: bytes, timestamp: str, secret: str
) -> str:
    path = _unescape(raw_path, plus_is_space=False)
    message = b"\n".join([path, canonical(raw_query), method.encode(), timestamp.encode()]) + b"\n"
    mac = hmac.new(decode_key(secret), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def check(
    *,
    method: str,
    raw_path: bytes,
    raw_query: bytes,
    headers: Mapping[str, str],
    access_key_id: str,
    secret: str,
    max_skew: timedelta,
    now: datetime | None = None,
) -> None:
    """Raise Refused unless the request carries a valid, timely signature."""
    h = {k.lower(): v for k, v in headers.items()}
    timestamp, auth = h.get("x-crusoe-timestamp"), h.get("authorization")
    if not timestamp or not auth:
        raise Refused("missing X-Crusoe-Timestamp or Authorization header")
    prefix = "Bearer 1.0:"
    if not auth.startswith(prefix) or auth.count(":") != 2:
        raise Refused("Authorization is not 'Bearer 1.0:<key id>:<signature>'")
    key_id, given = auth[len(prefix) :].split(":")
    if not key_id or not given:
        raise Refused("Authorization is not 'Bearer 1.0:<key id>:<signature>'")
    if not hmac.compare_digest(key_id.encode(), access_key_id.encode()):
        raise Refused("unknown access key id")
    try:
        at = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        try:
            at = datetime.fromisoformat(timestamp)
        except ValueError:
            raise Refused("X-Crusoe-Timestamp is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise Refused("X-Crusoe-Timestamp has no time zone")
    skew = at - (now or datetime.now(UTC))
    if abs(skew) > max_skew:
        raise Refused(f"X-Crusoe-Timestamp is {skew.total_seconds():+.0f}s off the clock")
    want = expected_signature(
        method=method, raw_path=raw_path, raw_query=raw_query, timestamp=timestamp, secret=secret
    )
    if not hmac.compare_digest(want.encode(), given.encode()):
        raise Refused("signature does not match")
