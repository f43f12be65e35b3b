"""The proof that a person made a decision: a short-lived JWT the API signs once it has
verified who they are (Slack's signed click, or their own operator token), bound to one
subject, one step (the kind of decision), one approver and one verdict:

    incident approval   subject: the incident id      step: the rung (reset_gpu, reboot...)
    breaker reset       subject: core.guard.reset_subject (the guard and the trip)
                        step: core.guard.BREAKER_RESET_STEP
    sharing workflow's move   subject: core.sharing.move_subject (the sharing workflow and the move)
                        step: core.sharing.MOVE_APPROVAL_STEP

Why a proof at all: approvals are Temporal updates, and anyone who can reach Temporal's
frontend can send an update with any approver's name in it. The worker holds the keys
(`[approval] keys`, shared with the API, never with a CLI) and refuses a decision whose proof
is missing, forged, expired, or for anything else than what it decides.

HS256 with PyJWT: both ends are ours and share the key; no public-key machinery needed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jwt

AUDIENCE = "autoclusters:decision"
ISSUER = "autoclusters-api"
LIFETIME_S = 300  # long enough for a slow Temporal round trip, short enough to be useless later
LEEWAY_S = 30  # the API's and the worker's clocks


class ProofRefused(Exception):
    pass


@dataclass(frozen=True)
class Decision:
    subject: str  # what is decided on: an incident, a guard's trip, a move (above)
    step: str  # the kind of decision, or the incident's step
    approver: str
    approve: bool
    via: str  # slack:<user id> | token:<grant name>


def sign(d: Decision, key: str, *, now: float | None = None) -> str:
    iat = int(time.time() if now is None else now)
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": d.approver,
        "subject": d.subject,
        "step": d.step,
        "approve": d.approve,
        "via": d.via,
        "iat": iat,
        "exp": iat + LIFETIME_S,
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(claims, key, algorithm="HS256")


def verify(proof: str, keys: Sequence[str]) -> Decision:
    """The decision a valid proof carries; ProofRefused (saying why) otherwise."""
    if not keys:
        raise ProofRefused(
            "no approval keys ([approval] keys) configured on the worker: decisions are refused"
        )
    if not proof:
        raise ProofRefused("no proof of who decided (decide through the API or Slack)")
    last: Exception | None = None
    for key in keys:
        try:
            c = jwt.decode(
                proof,
                key,
                algorithms=["HS256"],  # never "none", never what the token says
                audience=AUDIENCE,
                issuer=ISSUER,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iat", "sub", "aud", "iss"]},
            )
        except jwt.InvalidSignatureError as e:
            last = e
            continue  # perhaps signed with the other key of a rotation
        except jwt.ExpiredSignatureError:
            raise ProofRefused("the proof of who decided has expired") from None
        except jwt.InvalidTokenError as e:
            raise ProofRefused(f"invalid proof of who decided: {e}") from None
        try:
            return Decision(
                subject=str(c["subject"]),
                step=str(c["step"]),
                approver=str(c["sub"]),
                approve=bool(c["approve"]),
                via=str(c.get("via", "")),
            )
        except KeyError as e:
            raise ProofRefused(f"invalid proof of who decided: no {e}") from None
    raise ProofRefused(f"the proof of who decided is not signed by our key ({last})")


def mismatch(d: Decision, *, subject: str, step: str, approver: str, approve: bool) -> str:
    """Why a valid proof does not cover this decision ('' when it does)."""
    if d.subject != subject:
        return f"the proof is for {d.subject}, not {subject}"
    if d.step != step:
        return f"the proof is for step {d.step}, not {step}"
    if d.approver != approver:
        return f"the proof is {d.approver}'s, not {approver}'s"
    if d.approve != approve:
        return f"the proof is to {'approve' if d.approve else 'reject'}, not the opposite"
    return ""
