"""Alert evidence on the incident, over real HTTP against a Temporal dev server with a
worker (test_api.py's set-up):

- the alert's labels and annotations (Japanese and emoji intact), its startsAt as the
  fault's time, and the summary and runbook link in the opening notification;
- the same instant written `+09:00` and `Z` is one alert;
- `truncatedAlerts` is counted;
- a resolution is recorded on the incident: in the payload that opens it, and after the
  API restarted (it lives in the incident, not in the API's memory); it never stops it;
- exactly one caller is told `opened` when three open one node at once;
- an unknown fault kind is a 422 naming it and its field, pointing at `autoclusters faults`,
  and starts nothing.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta, timezone

import httpx
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients import incidents
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.node_report import NodeReport
from tests.api.test_api import (  # noqa: F401  (fixtures)
    AGENT_AUTH,
    AM,
    AUTH,
    INVENTORY,
    STARTS,
    alert,
    api_server,
    dev_server_env,
    http,
    payload,
    pytestmark,
    settings,
    started,
    status,
    task_queue,
)

SUMMARY = "GPU 3 が応答しません 🔥 (Xid 79)"
DESCRIPTION = "ノード gpu-060 の GPU がバスから外れました。交換が必要です 🛠️"
RUNBOOK = "https://runbooks.example.com/gpu/xid-79#対処"
UUID = "GPU-8f3a2c1e-5b7d-4e9a-a1c2-3d4e5f6a7b8c"


def _evidenced(node: str) -> dict[str, object]:
    a = alert(node, fingerprint="00000000000000e1", UUID=UUID, pci_bus_id="00000000:3B:00.0")
    a["annotations"] = {"summary": SUMMARY, "description": DESCRIPTION, "runbook_url": RUNBOOK}
    return a


async def test_the_alerts_words_reach_the_incident_intact(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    r = await http.post(AM, json=payload(_evidenced("gpu-060")), headers=AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["incidents"][0]["opened"] is True
    state = await status(env.client, settings, "gpu-060")
    (fault,) = state.faults
    (ev,) = fault.evidence
    assert (ev.summary, ev.description, ev.runbook_url) == (SUMMARY, DESCRIPTION, RUNBOOK)
    assert ev.labels["UUID"] == UUID and ev.labels["pci_bus_id"] == "00000000:3B:00.0"
    assert ev.annotations["summary"] == SUMMARY
    assert fault.first_at == STARTS == ev.starts_at  # the alert's time, not our receive time
    # `incident show --json` prints this state: the words come out as they went in.
    dumped = state.model_dump_json()
    assert SUMMARY in dumped and RUNBOOK in dumped


async def test_the_same_instant_in_two_zones_is_one_alert(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    utc = alert("gpu-061", fingerprint="00000000000000e2")
    tokyo = dict(utc)
    tokyo["startsAt"] = STARTS.astimezone(timezone(timedelta(hours=9))).isoformat()
    assert tokyo["startsAt"] != utc["startsAt"]
    r1 = await http.post(AM, json=payload(utc), headers=AUTH)
    r2 = await http.post(AM, json=payload(tokyo), headers=AUTH)
    assert (r1.json()["deduplicated"], r2.json()["deduplicated"]) == (0, 1)


async def test_truncated_alerts_are_counted(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    body = payload(alert("gpu-062"))
    body["truncatedAlerts"] = 7
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 202
    metrics = (await http.get("/metrics")).text
    assert "autoclusters_api_alerts_truncated_total 7.0" in metrics


async def test_resolutions_are_recorded_on_the_incident_even_after_a_restart(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
) -> None:
    xid = alert("gpu-063", fingerprint="00000000000000e3")
    ecc = alert("gpu-063", "GpuDoubleBitEcc", fingerprint="00000000000000e4")
    xid_gone = xid | {"status": "resolved", "endsAt": "2026-05-01T10:04:00Z"}
    ecc_gone = ecc | {"status": "resolved", "endsAt": "2026-05-01T10:09:00Z"}
    async with api_server(settings) as first:
        # The payload that opens the incident already says the ECC alert resolved.
        r = await first.post(AM, json=payload(xid, ecc, ecc_gone), headers=AUTH)
        assert r.status_code == 202, r.text
    async with api_server(settings) as after_restart:  # nothing of the first in memory
        r = await after_restart.post(AM, json=payload(xid_gone), headers=AUTH)
        assert r.status_code == 202, r.text
    state = await status(env.client, settings, "gpu-063")
    resolved = {f.fault: (f.resolved_at, f.resolved_by) for f in state.faults}
    assert resolved["XID_79"] == (STARTS + timedelta(minutes=4), "alertmanager")
    assert resolved["ECC_DBE"] == (STARTS + timedelta(minutes=9), "alertmanager")
    assert state.status == "open"  # a cleared fault never stops the remediation


async def test_an_agents_cleared_report_is_recorded_on_the_incident(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    since = STARTS
    firing = NodeReport.build(
        node="gpu-064", fault="ECC_DBE", state="firing", observed_at=since, since=since,
        message="GPU 3: 2 uncorrected ECC errors", evidence={"subjects": [{"gpu": 3}]},
    )  # fmt: skip
    r = await http.post("/v1/reports", content=firing.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    later = since + timedelta(minutes=2)
    cleared = NodeReport.build(
        node="gpu-064", fault="ECC_DBE", state="resolved", observed_at=later, since=since
    )
    r = await http.post("/v1/reports", content=cleared.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    state = await status(env.client, settings, "gpu-064")
    (fault,) = state.faults
    assert (fault.resolved_at, fault.resolved_by) == (later, "agent")
    assert fault.evidence[0].readings == {"subjects": [{"gpu": 3}]}
    assert fault.evidence[0].summary == "GPU 3: 2 uncorrected ECC errors"


async def test_three_parallel_opens_tell_exactly_one_caller_opened(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
) -> None:
    async def open_one() -> incidents.OpenedIncident:
        return await incidents.open_incident(
            env.client, settings, "gpu-065", "XID_79", opened_by="cli", inventory=INVENTORY
        )

    results = await asyncio.gather(open_one(), open_one(), open_one())
    assert sorted(r.opened for r in results) == [False, False, True]
    assert len({r.incident_id for r in results}) == 1


async def test_an_unknown_fault_kind_is_422_and_starts_nothing(
    env: WorkflowEnvironment,  # noqa: F811
    settings: ApiSettings,  # noqa: F811
    http: httpx.AsyncClient,  # noqa: F811
) -> None:
    odd = alert("gpu-066", "Whatever", fault="NOT_A_REAL_FAULT")
    r = await http.post(AM, json=payload(odd), headers=AUTH)
    assert r.status_code == 422, r.text
    assert r.json()["faults"] == ["NOT_A_REAL_FAULT"] and r.json()["fields"] == ["alerts[0]"]
    assert "'autoclusters faults'" in r.json()["detail"]
    rep = NodeReport.build(
        node="gpu-066", fault="NOT_A_REAL_FAULT", state="firing",
        observed_at=STARTS, since=STARTS,
    )  # fmt: skip
    r = await http.post("/v1/reports", content=rep.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 422, r.text
    assert not await started(env.client, settings, "gpu-066")
