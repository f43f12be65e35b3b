"""The client's signer and the emulator's independent check agree with the public algorithm.

Each vector writes out, by hand, the string Crusoe's Go signer would sign (or says that it
refuses to sign at all). Both implementations are held to it: the client's `sign` must
produce HMAC(key, that string), and the emulator's check must accept exactly that and
refuse a signature over anything else.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import unquote_to_bytes

import pytest

from autoclusters.integrations.crusoe.signing import (
    SigningError,
    check_raw_path,
    decode_secret_key,
    sign,
)
from autoclusters.sandbox.crusoe import signature as crusoe_signature

TS = "2026-03-26T12:00:00Z"
NOW = datetime(2026, 3, 26, 12, 0, 30, tzinfo=UTC)
KEY = bytes(range(32))
SECRET = base64.urlsafe_b64encode(KEY).decode().rstrip("=")  # 43 characters, unpadded
P = "/v1/projects/p1/compute/vms/instances"


@dataclass(frozen=True)
class Vector:
    name: str
    method: str
    raw_path: str
    raw_query: str
    message: str | None  # what Go signs; None: it refuses to sign
    secret: str = SECRET


VECTORS = [
    Vector("plain GET", "GET", P, "", f"{P}\n\nGET\n{TS}\n"),
    Vector("lower-case method is signed as sent", "get", P, "", f"{P}\n\nget\n{TS}\n"),
    Vector("mixed-case method", "Patch", P + "/vm-1", "", f"{P}/vm-1\n\nPatch\n{TS}\n"),
    Vector("keys sorted", "GET", P, "b=2&a=1", f"{P}\na=1&b=2\nGET\n{TS}\n"),
    Vector("repeated key keeps order", "GET", P, "a=2&b=0&a=1", f"{P}\na=2&a=1&b=0\nGET\n{TS}\n"),
    Vector("plus is a space, re-escaped as plus", "GET", P, "q=x+y", f"{P}\nq=x+y\nGET\n{TS}\n"),
    Vector("needless escapes re-encoded", "GET", P, "z=%7E%41", f"{P}\nz=~A\nGET\n{TS}\n"),
    Vector("reserved kept escaped", "GET", P, "n=a%2Cb%3D", f"{P}\nn=a%2Cb%3D\nGET\n{TS}\n"),
    Vector("bare key, empty pieces", "GET", P, "x&&y=", f"{P}\nx=&y=\nGET\n{TS}\n"),
    Vector("utf-8 upper-case hex", "GET", P, "k=caf%c3%a9", f"{P}\nk=caf%C3%A9\nGET\n{TS}\n"),
    Vector("escaped path is signed decoded", "GET", "/v1/a%20b", "", f"/v1/a b\n\nGET\n{TS}\n"),
    Vector(
        "secret with a trailing newline", "GET", P, "", f"{P}\n\nGET\n{TS}\n", secret=SECRET + "\n"
    ),
    Vector(
        "secret with CRLF inside",
        "GET",
        P,
        "",
        f"{P}\n\nGET\n{TS}\n",
        secret=SECRET[:20] + "\r\n" + SECRET[20:],
    ),
    Vector("semicolon refused", "GET", P, "a=1;b=2", None),
    Vector("bad escape in query refused", "GET", P, "a=%zz", None),
    Vector("bad escape in path refused", "GET", "/v1/projects/%zz", "", None),
    Vector("padded secret refused", "GET", P, "", None, secret=SECRET + "="),
    Vector("secret with a space refused", "GET", P, "", None, secret=" " + SECRET),
]


def by_hand(message: str) -> str:
    mac = hmac.new(KEY, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def client_headers(v: Vector) -> dict[str, str]:
    check_raw_path(v.raw_path)
    return sign(
        method=v.method,
        path=unquote_to_bytes(v.raw_path).decode(),
        query=v.raw_query,
        timestamp=TS,
        access_key_id="kid",
        secret_key=v.secret,
    )


def emulator_check(v: Vector, headers: dict[str, str], secret: str = SECRET) -> None:
    crusoe_signature.check(
        method=v.method,
        raw_path=v.raw_path.encode(),
        raw_query=v.raw_query.encode(),
        headers=headers,
        access_key_id="kid",
        secret=secret,
        max_skew=timedelta(minutes=5),
        now=NOW,
    )


def test_there_are_enough_independent_vectors() -> None:
    assert len(VECTORS) >= 18
    assert sum(v.message is None for v in VECTORS) >= 5


@pytest.mark.parametrize("v", [v for v in VECTORS if v.message is not None], ids=lambda v: v.name)
def test_the_client_signs_what_go_signs(v: Vector) -> None:
    assert v.message is not None
    headers = client_headers(v)
    assert headers["Authorization"] == f"Bearer 1.0:kid:{by_hand(v.message)}"
    assert headers["X-Crusoe-Timestamp"] == TS


@pytest.mark.parametrize("v", [v for v in VECTORS if v.message is not None], ids=lambda v: v.name)
def test_the_emulator_accepts_exactly_that_signature(v: Vector) -> None:
    assert v.message is not None
    good = {"X-Crusoe-Timestamp": TS, "Authorization": f"Bearer 1.0:kid:{by_hand(v.message)}"}
    emulator_check(v, good)
    # A signature over any other string (here: the method upper-cased, a trailing space
    # in the query line) is refused.
    for other in (
        v.message.replace(f"\n{v.method}\n", f"\n{v.method.upper()}x\n"),
        v.message + " ",
    ):
        bad = {"X-Crusoe-Timestamp": TS, "Authorization": f"Bearer 1.0:kid:{by_hand(other)}"}
        with pytest.raises(crusoe_signature.Refused, match="does not match"):
            emulator_check(v, bad)


@pytest.mark.parametrize("v", [v for v in VECTORS if v.message is None], ids=lambda v: v.name)
def test_both_refuse_what_go_refuses(v: Vector) -> None:
    with pytest.raises(SigningError):
        client_headers(v)
    # Whatever a careless client signed for it, the emulator refuses it too.
    naive = f"{v.raw_path}\n{v.raw_query}\n{v.method}\n{TS}\n"
    headers = {"X-Crusoe-Timestamp": TS, "Authorization": f"Bearer 1.0:kid:{by_hand(naive)}"}
    with pytest.raises(crusoe_signature.Refused):
        emulator_check(v, headers, secret=v.secret)


def test_secret_decoding_agrees() -> None:
    for secret in (SECRET, SECRET + "\n", SECRET[:10] + "\r\n" + SECRET[10:]):
        assert decode_secret_key(secret) == KEY == crusoe_signature.decode_key(secret)
    for bad in (SECRET + "=", SECRET + " ", "a", "", "+/"):
        with pytest.raises(SigningError):
            decode_secret_key(bad)
        with pytest.raises(crusoe_signature.Refused):
            crusoe_signature.decode_key(bad)


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({}, "missing"),
        ({"X-Crusoe-Timestamp": TS, "Authorization": "Bearer 2.0:kid:x"}, "Bearer 1.0"),
        ({"X-Crusoe-Timestamp": TS, "Authorization": "Bearer 1.0:other:x"}, "unknown access"),
        (
            {"X-Crusoe-Timestamp": "2026-03-26T11:54:00Z", "Authorization": "Bearer 1.0:kid:x"},
            "off the clock",
        ),
        (
            {"X-Crusoe-Timestamp": "2026-03-26T12:06:00Z", "Authorization": "Bearer 1.0:kid:x"},
            "off the clock",
        ),
    ],
)
def test_the_emulator_refuses_bad_headers(headers: dict[str, str], why: str) -> None:
    with pytest.raises(crusoe_signature.Refused, match=why):
        emulator_check(VECTORS[0], headers)
