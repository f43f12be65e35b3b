"""Maintenance silences (activities/silences.py) against a real Alertmanager (Debian's
prometheus-alertmanager on a loopback port of its own), read back with Debian's `amtool`:

- the step silences every alert on the node but AutoClusters' own (`autoclusters!=remediate`)
  with an end time; a retry finds that silence instead of making a second one;
- the lift expires it;
- with Alertmanager away, the silence answers "not silenced" and the lift "ends by itself":
  the runbook goes on.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.silences import SilenceActivities
from autoclusters.core.models import LiftSilenceInput, SilenceInput, SilenceResult
from autoclusters.integrations.alertmanager import AlertmanagerClient

pytestmark = [
    pytest.mark.integration,  # a real Alertmanager process
    pytest.mark.skipif(
        shutil.which("prometheus-alertmanager") is None or shutil.which("amtool") is None,
        reason="needs Debian's prometheus-alertmanager (scripts/system-deps.sh)",
    ),
]

INCIDENT = "inc-20261202-070000-gpu-03"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    proc = subprocess.Popen(
        [
            "prometheus-alertmanager", f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _ready(url):
            assert proc.poll() is None, "alertmanager exited"
            assert time.monotonic() < deadline, "alertmanager not ready in 30 s"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Any:
    return asyncio.run(ActivityEnvironment().run(fn, arg))


def acts(url: str) -> SilenceActivities:
    return SilenceActivities(AlertmanagerClient(url), node_label="node", max_s=3600)


def amtool_silences(url: str, *matchers: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["amtool", "silence", "query", f"--alertmanager.url={url}", "-o", "json", *matchers],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found: list[dict[str, Any]] = json.loads(out or "[]")
    return found


def test_the_node_is_silenced_once_until_the_lift(alertmanager: str) -> None:
    ask = SilenceInput(node="gpu-03", incident_id=INCIDENT, fault="XID_79")
    first: SilenceResult = run(acts(alertmanager).silence_node_alerts, ask)
    assert first.silence_id and first.silence_id in first.detail
    [silence] = amtool_silences(alertmanager, "node=gpu-03")
    assert silence["id"] == first.silence_id and silence["status"]["state"] == "active"
    assert silence["createdBy"] == "autoclusters" and silence["comment"].startswith(INCIDENT)
    matchers = {(m["name"], m["value"], m["isEqual"]) for m in silence["matchers"]}
    assert matchers == {("node", "gpu-03", True), ("autoclusters", "remediate", False)}
    ends = datetime.fromisoformat(silence["endsAt"].replace("Z", "+00:00"))
    assert 3500 < (ends - datetime.now(UTC)).total_seconds() <= 3600
    assert amtool_silences(alertmanager, "node=gpu-04") == []  # only that node

    again: SilenceResult = run(acts(alertmanager).silence_node_alerts, ask)
    assert again.silence_id == first.silence_id  # a retry: the same silence
    assert len(amtool_silences(alertmanager, "node=gpu-03")) == 1

    lifted = run(
        acts(alertmanager).lift_silence,
        LiftSilenceInput(silence_id=first.silence_id, incident_id=INCIDENT),
    )
    assert lifted == f"silence {first.silence_id} lifted"
    assert amtool_silences(alertmanager, "node=gpu-03") == []  # query lists active ones
    # Lifting again (a retry) is a no-op, not an error.
    again_lifted = run(
        acts(alertmanager).lift_silence,
        LiftSilenceInput(silence_id=first.silence_id, incident_id=INCIDENT),
    )
    assert again_lifted == lifted and amtool_silences(alertmanager, "node=gpu-03") == []


def test_an_alertmanager_away_does_not_stop_the_runbook() -> None:
    away = f"http://127.0.0.1:{_free_port()}"  # nothing listens
    out: SilenceResult = run(
        acts(away).silence_node_alerts,
        SilenceInput(node="gpu-03", incident_id=INCIDENT, fault="XID_79"),
    )
    assert out.silence_id is None and out.detail.startswith("not silenced, going on:")
    assert "Alertmanager unavailable" in out.detail
    lifted = run(acts(away).lift_silence, LiftSilenceInput(silence_id="x", incident_id=INCIDENT))
    assert "ends by itself" in lifted
    none: SilenceResult = run(
        SilenceActivities(None, node_label="node", max_s=60).silence_node_alerts,
        SilenceInput(node="gpu-03", incident_id=INCIDENT, fault="XID_79"),
    )
    assert none.silence_id is None and "no Alertmanager configured" in none.detail
