"""Incident ids never become query syntax: a lookup with quotes or query words finds
nothing, says so in one line, and never reaches Temporal's visibility query."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from autoclusters.clients import incidents
from autoclusters.core.settings import Settings

HOSTILE = [
    "nosuch' OR Node = 'gpu-03",
    "'",
    "inc-20261130-193340-gpu-02' OR IncidentId != '",
    "inc-20261130-193340-gpu-02 OR true",
    "",
]


class NoTemporal:
    """A client that fails the test if anything reaches Temporal."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a hostile id reached Temporal ({name})")


@pytest.mark.parametrize("incident_id", HOSTILE)
async def test_a_hostile_id_is_refused_before_any_query(incident_id: str) -> None:
    with pytest.raises(incidents.IncidentNotFound, match="is not an incident id"):
        await incidents.find_incident(NoTemporal(), Settings(), incident_id)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["show", "approve"])
def test_the_cli_prints_one_line_and_exits_1(command: str, cli_env: dict[str, str]) -> None:
    hostile = HOSTILE[0]
    argv = ["incident", "show", hostile] if command == "show" else ["approve", hostile]
    r = subprocess.run(
        [sys.executable, "-m", "autoclusters.clients.cli", *argv],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r
    lines = [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "is not an incident id" in lines[0]
    assert "Traceback" not in r.stderr
