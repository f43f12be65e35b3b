"""Crusoe API v1 request signing, against vectors computed without our implementation.

Aspects: the canonical query (several keys, a repeated key kept in order, escapes re-encoded
the Go way, `;` and bad escapes refused), the string to sign, the signature (hard-coded
vectors from openssl, and HMAC computed by hand in the test), the timestamp format,
verification (key id, signature, a window both ways), and the httpx auth hook.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from pydantic import SecretStr

from autoclusters.integrations.crusoe import signing
from autoclusters.integrations.crusoe.signing import (
    CrusoeAuth,
    SignatureError,
    SigningError,
    canonical_query,
    format_timestamp,
    sign,
    string_to_sign,
    verify,
)

# The key is bytes 0..31, base64url without padding.
SECRET = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
KEY = bytes(range(32))
TS = "2026-03-26T12:00:00Z"
PATH = "/v1/projects/p1/compute/vms/instances"
# Several keys out of order, `a` repeated (2 before 1), an escaped `=`, a `+` space,
# an escaped comma, `~` escaped needlessly, `!`, an empty value and a UTF-8 key and value.
QUERY = "b=c%3Dd+e&a=2&names=gpu-01%2Cgpu-02&a=1&z=%7E%21&empty=&%C3%A9=caf%C3%A9"
# Worked by hand: unescape, sort by key bytes (a, a, b, empty, names, z, 0xC3A9) keeping
# a's values in their order, re-escape like Go's url.QueryEscape (only A-Za-z0-9-_.~ bare,
# space as +).
CANONICAL = "a=2&a=1&b=c%3Dd+e&empty=&names=gpu-01%2Cgpu-02&z=~%21&%C3%A9=caf%C3%A9"
# From openssl, not from this code:
#   printf '<PATH>\n<CANONICAL>\nGET\n2026-03-26T12:00:00Z\n' |
#     openssl dgst -sha256 -mac HMAC -macopt hexkey:000102...1f -binary | basenc --base64url
GET_SIGNATURE = "TV8W83eQstik8Lo_BRHgpmFOpk8LmSucNJoHzepsGNs"
# The same for PATCH /v1/projects/p1/compute/vms/instances/vm-1 with no query.
PATCH_SIGNATURE = "DDdz7n9o46jVc7WcsVOyfd-4pSN3-2Sg-9qvnA38T5E"


def by_hand(payload: str, key: bytes = KEY) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def test_canonical_query_sorts_keys_keeps_repeated_values_in_order_and_reescapes() -> None:
    assert canonical_query(QUERY) == CANONICAL
    assert canonical_query(QUERY.encode()) == CANONICAL
    assert canonical_query("") == ""
    assert canonical_query("x=1&&y") == "x=1&y="  # empty pairs dropped, a bare key is k=


def test_canonical_query_refuses_semicolons_and_bad_escapes() -> None:
    with pytest.raises(SigningError, match="semicolon"):
        canonical_query("a=1;b=2")
    with pytest.raises(SigningError, match="escape"):
        canonical_query("a=%zz")


def test_string_to_sign_is_four_newline_terminated_lines() -> None:
    payload = string_to_sign(method="GET", path=PATH, query=QUERY, timestamp=TS)
    assert payload == f"{PATH}\n{CANONICAL}\nGET\n{TS}\n".encode()
    # The method as sent, as Go signs req.Method: HTTP methods are case-sensitive.
    lower = string_to_sign(method="get", path=PATH, query=QUERY, timestamp=TS)
    assert lower == f"{PATH}\n{CANONICAL}\nget\n{TS}\n".encode()
    empty = string_to_sign(method="DELETE", path="/v1/x", query="", timestamp=TS)
    assert empty == f"/v1/x\n\nDELETE\n{TS}\n".encode()


def test_signatures_match_vectors_from_openssl() -> None:
    headers = sign(
        method="GET", path=PATH, query=QUERY, timestamp=TS, access_key_id="kid", secret_key=SECRET
    )
    assert headers == {
        "X-Crusoe-Timestamp": TS,
        "Authorization": f"Bearer 1.0:kid:{GET_SIGNATURE}",
    }
    patch = sign(
        method="PATCH",
        path=f"{PATH}/vm-1",
        query="",
        timestamp=TS,
        access_key_id="kid",
        secret_key=SECRET,
    )
    assert patch["Authorization"] == f"Bearer 1.0:kid:{PATCH_SIGNATURE}"


def test_signature_matches_hmac_by_hand_for_other_keys() -> None:
    raw_key = b"\xfb\xff\xfe" * 11  # base64url needs - and _ here, where base64 has + and /
    secret = base64.urlsafe_b64encode(raw_key).decode().rstrip("=")
    assert "-" in secret or "_" in secret
    headers = sign(
        method="POST",
        path="/v1/a b",
        query="q=x+y",
        timestamp=TS,
        access_key_id="k",
        secret_key=secret,
    )
    expected = by_hand(f"/v1/a b\nq=x+y\nPOST\n{TS}\n", raw_key)
    assert headers["Authorization"] == f"Bearer 1.0:k:{expected}"
    # A padded key is refused, as Go's base64.RawURLEncoding refuses it.
    padded = base64.urlsafe_b64encode(raw_key[:32]).decode()
    assert padded.endswith("=")
    with pytest.raises(SigningError):
        signing.signature(b"x", padded)


def test_a_secret_key_that_is_not_base64url_is_refused_without_echoing_it() -> None:
    with pytest.raises(SigningError) as e:
        signing.signature(b"x", "not base64/+!")
    assert "not base64/+!" not in str(e.value)


def test_timestamp_is_rfc3339_utc_to_the_second() -> None:
    assert format_timestamp(datetime(2026, 3, 26, 12, 0, 0, 987654, tzinfo=UTC)) == TS
    plus_two = timezone(timedelta(hours=2))
    assert format_timestamp(datetime(2026, 3, 26, 14, 0, 0, tzinfo=plus_two)) == TS


def _headers(timestamp: str = TS, key_id: str = "kid", secret: str = SECRET) -> dict[str, str]:
    return sign(
        method="GET",
        path=PATH,
        query=QUERY,
        timestamp=timestamp,
        access_key_id=key_id,
        secret_key=secret,
    )


def _verify(headers: dict[str, str], now: datetime) -> None:
    verify(
        method="GET",
        path=PATH,
        query=QUERY,
        headers=headers,
        access_key_id="kid",
        secret_key=SECRET,
        max_skew=timedelta(minutes=5),
        now=now,
    )


def test_verify_accepts_a_good_request_within_the_window() -> None:
    at = datetime(2026, 3, 26, 12, 0, 0, tzinfo=UTC)
    _verify(_headers(), at)
    _verify(_headers(), at + timedelta(minutes=4))
    _verify(_headers(), at - timedelta(minutes=4))
    lower = {k.lower(): v for k, v in _headers().items()}  # header names are case-blind
    _verify(lower, at)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing"),
        ({"X-Crusoe-Timestamp": TS, "Authorization": "Basic abc"}, "Bearer"),
        (_headers(key_id="other"), "unknown access key"),
        (
            _headers(secret=base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")),
            "does not match",
        ),
        (_headers(timestamp="2026-03-26T11:54:59Z"), "off the clock"),  # stale
        (_headers(timestamp="2026-03-26T12:05:01Z"), "off the clock"),  # from the future
        (_headers(timestamp="yesterday"), "RFC 3339"),
    ],
)
def test_verify_refuses(headers: dict[str, str], reason: str) -> None:
    with pytest.raises(SignatureError, match=reason):
        _verify(headers, datetime(2026, 3, 26, 12, 0, 0, tzinfo=UTC))


def test_verify_refuses_a_tampered_query_or_method() -> None:
    headers = _headers()
    at = datetime(2026, 3, 26, 12, 0, 0, tzinfo=UTC)
    with pytest.raises(SignatureError):
        verify(
            method="DELETE", path=PATH, query=QUERY, headers=headers,
            access_key_id="kid", secret_key=SECRET, now=at,
        )  # fmt: skip
    with pytest.raises(SignatureError):
        verify(
            method="GET", path=PATH, query="a=1", headers=headers,
            access_key_id="kid", secret_key=SECRET, now=at,
        )  # fmt: skip


def test_httpx_auth_signs_path_with_prefix_and_query() -> None:
    auth = CrusoeAuth("kid", SecretStr(SECRET))
    request = httpx.Request(
        "GET",
        "https://api.example/v1/projects/p1/compute/vms/instances",
        params=[("names", "gpu-02"), ("ids", "b"), ("names", "gpu-01 x")],
    )
    signed = next(auth.auth_flow(request))
    ts = signed.headers["X-Crusoe-Timestamp"]
    # httpx writes the space as %20; the canonical form is Go's (+).
    canonical = "ids=b&names=gpu-02&names=gpu-01+x"
    expected = by_hand(f"{PATH}\n{canonical}\nGET\n{ts}\n")
    assert signed.headers["Authorization"] == f"Bearer 1.0:kid:{expected}"
    assert SECRET not in repr(auth)
