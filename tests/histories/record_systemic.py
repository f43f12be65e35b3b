"""Record the replay histories of a systemic incident (docs/systemic.md): a leaf's four
members drained and parked, one hand-off, `fixed`, screened together, returned.

    .venv/bin/python scripts/record-histories.py RELEASE systemic

Writes systemic_incident_<RELEASE>_leaf_fixed.json (SystemicIncident),
remediation_<RELEASE>_systemic_member.json (a member's NodeRemediation) and
fleet_guard_<RELEASE>_systemic.json (its guard).
"""

from __future__ import annotations

import asyncio
import os
import sys

from tests.helpers import time_skipping_env
from tests.histories.record import _write
from tests.workflows.test_systemic_incident import (
    LEAF_01,
    _answer,
    _ended,
    _handed_off,
    _leaf,
    _leaf_policy,
    _open,
    _results,
    _systemic,
    _systemic_until,
)


async def main(release: str) -> None:
    async with await time_skipping_env() as env, _leaf(env) as (f, _screens):
        handles = await _open(f, LEAF_01, _leaf_policy(f))
        await _systemic_until(f, _handed_off, "the hand-off")
        await _answer(f, "fixed")
        await _results(handles)
        await _ended(f)
        _write(f"systemic_incident_{release}_leaf_fixed", await _systemic(f).fetch_history())
        _write(f"remediation_{release}_systemic_member", await handles[0].fetch_history())
        await f.guard.terminate(reason="recorded")
        _write(f"fleet_guard_{release}_systemic", await f.guard.fetch_history())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
    os._exit(0)  # the SDK's runtime can crash at interpreter exit (sdk-python#300)
