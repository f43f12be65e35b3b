"""The console's training jobs (issue 40): step time per rank, the hung or slow rank marked.

Aspects:
- the marks come from the open JOB_HANG / SLOW_NODE incidents' evidence (the agent's
  subjects): the hung rank with its rule and figures, a slow node's ranks with the ratio;
- the figures come from Prometheus (the agent's autoclusters_job_* series): the node page
  reads its jobs by Hostname, then every rank of those jobs by job_id, so a straggler is
  seen beside its peers on other nodes; the job page reads one job;
- no Prometheus, or one that does not answer: the page says so, and the named ranks show;
- over HTTP: the node page and the job page (and their JSON twins) mark the rank; a job no
  rank reports is a 404.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio

from autoclusters.clients.console import job_steps
from autoclusters.clients.console.routes import Console
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultSeen, IncidentState
from autoclusters.core.settings_groups import MonitoringSettings
from tests.console.test_console import T0, app_for, incident, login, settings

HANG = {
    "job": "4242", "rank": 3, "node": "gpu-02", "rule": "heartbeat", "stalled_s": 40.0,
    "threshold_s": 25.0, "step": 100, "in_collective": False, "heartbeat_age_s": 40.0,
}  # fmt: skip
SLOW = {
    "job": "4242", "node": "gpu-02", "ranks": [2, 3], "rule": "slow_steps", "ratio": 2.01,
    "slow_ratio": 1.5, "steps": list(range(91, 101)), "node_busy_s": [2.0] * 10,
}  # fmt: skip


def silent(fault: str, subject: dict[str, Any], node: str = "gpu-02") -> IncidentState:
    inc = incident(node)
    inc.request.fault = fault
    evidence = FaultEvidence(source="agent", readings={"subjects": [subject]})
    inc.faults = [FaultSeen(fault=fault, source="agent", first_at=T0, last_at=T0,
                            evidence=[evidence])]  # fmt: skip
    return inc


def test_the_marks_are_the_incidents_verdicts() -> None:
    got = job_steps.marks([silent("JOB_HANG", HANG)])
    [(key, rank)] = got.items()
    assert key == ("4242", 3) and rank.mark == "hung" and rank.node == "gpu-02"
    assert rank.why.startswith("JOB_HANG, rule heartbeat: no step for 40.0 s (threshold 25.0 s)")
    slow = job_steps.marks([silent("SLOW_NODE", SLOW)])
    assert sorted(slow) == [("4242", 2), ("4242", 3)]
    assert slow[("4242", 2)].mark == "slow" and "2.01x" in slow[("4242", 2)].why
    closed = silent("JOB_HANG", HANG)
    closed.status = "resolved"
    assert job_steps.marks([closed, incident("gpu-01")]) == {}


def _sample(name: str, job: str, rank: int, node: str, value: float) -> dict[str, Any]:
    return {"metric": {"__name__": name, "job_id": job, "rank": str(rank), "Hostname": node},
            "value": [1000, str(value)]}  # fmt: skip


def prometheus(asked: list[str]) -> httpx.MockTransport:
    """Job 4242: ranks 0-1 on gpu-01 at 1 s, ranks 2-3 on gpu-02 at 2 s busy."""
    ranks = [(0, "gpu-01", 1.0), (1, "gpu-01", 1.0), (2, "gpu-02", 2.0), (3, "gpu-02", 2.0)]

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        asked.append(query)
        if "job_id" in query:
            mine = ranks if "4242" in query else []
        else:
            mine = [r for r in ranks if f'Hostname="{r[1]}"' in query]
        result = [
            {"metric": {"__name__": job_steps.THRESHOLD, "job_id": "4242", "Hostname": n},
             "value": [1000, "25"]}
            for n in sorted({r[1] for r in mine})
        ]  # fmt: skip
        values = {"autoclusters_job_last_step": lambda b: 100.0,
                  "autoclusters_job_step_seconds": lambda b: 2.0,
                  "autoclusters_job_step_busy_seconds": lambda b: b,
                  "autoclusters_job_seconds_since_step": lambda b: 0.5}  # fmt: skip
        for name, value in values.items():
            result += [_sample(name, "4242", r, n, value(b)) for r, n, b in mine]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    return httpx.MockTransport(answer)


async def test_a_nodes_jobs_every_rank_with_the_slow_ones_marked() -> None:
    asked: list[str] = []
    async with httpx.AsyncClient(transport=prometheus(asked)) as client:
        got = await job_steps.read_steps(
            client, "http://prom:9090/", [silent("SLOW_NODE", SLOW)], node="gpu-02"
        )
    names = "|".join([*job_steps.SERIES.values(), job_steps.THRESHOLD])
    # Two queries: the node's jobs, then every rank of them.
    assert asked == [
        f'{{__name__=~"{names}",Hostname="gpu-02"}}',
        f'{{__name__=~"{names}",job_id=~"4242"}}',
    ]
    [job] = got.jobs
    assert job.job == "4242" and job.hang_threshold_s == 25
    rows = [(r.rank, r.node, r.step, r.busy_s, r.mark) for r in job.ranks]
    assert rows == [
        (0, "gpu-01", 100, 1.0, None), (1, "gpu-01", 100, 1.0, None),
        (2, "gpu-02", 100, 2.0, "slow"), (3, "gpu-02", 100, 2.0, "slow"),
    ]  # fmt: skip


async def test_without_prometheus_the_named_rank_still_shows() -> None:
    async with httpx.AsyncClient() as client:
        none = await job_steps.read_steps(client, None, [silent("JOB_HANG", HANG)], job="4242")
    assert not none.configured and [(r.rank, r.mark) for r in none.jobs[0].ranks] == [(3, "hung")]

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as client:
        failed = await job_steps.read_steps(
            client, "http://prom", [silent("JOB_HANG", HANG)], node="gpu-02"
        )
    assert failed.configured and failed.error and "connection refused" in failed.error
    assert [r.mark for r in failed.jobs[0].ranks] == ["hung"]


@pytest_asyncio.fixture
async def hung_http() -> AsyncIterator[httpx.AsyncClient]:
    app, source = app_for(
        settings(monitoring=MonitoringSettings(prometheus_url="http://prom:9090"))
    )
    source.open = [silent("JOB_HANG", HANG)]
    console: Console = app.state.console
    console.http = httpx.AsyncClient(transport=prometheus([]))
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        yield client
    await console.http.aclose()
    await console.shared.aclose()


async def test_the_node_and_job_pages_mark_the_hung_rank(hung_http: httpx.AsyncClient) -> None:
    await login(hung_http)
    node = (await hung_http.get("/ui/api/nodes/gpu-02")).json()
    ranks = node["steps"]["jobs"][0]["ranks"]
    assert [(r["rank"], r["mark"]) for r in ranks] == [(0, None), (1, None), (2, None),
                                                       (3, "hung")]  # fmt: skip
    page = (await hung_http.get("/ui/nodes/gpu-02")).text
    assert 'class="rank-hung" data-mark="hung"' in page and "rule heartbeat" in page
    job = await hung_http.get("/ui/api/jobs/4242")
    assert job.status_code == 200 and len(job.json()["steps"]["jobs"][0]["ranks"]) == 4
    html = await hung_http.get("/ui/jobs/4242")
    assert html.status_code == 200 and "Training job" in html.text and "rank-hung" in html.text
    assert 'data-page="job"' in html.text and 'data-api="/ui/api/jobs/4242"' in html.text


async def test_the_job_routes_need_a_login_and_an_unknown_job_is_a_404(
    hung_http: httpx.AsyncClient,
) -> None:
    for path in ("/ui/jobs/4242", "/ui/api/jobs/4242"):
        got = await hung_http.get(path)
        assert got.status_code == 401 and "heartbeat" not in got.text, path
    await login(hung_http)
    assert (await hung_http.get("/ui/api/jobs/9999")).status_code == 404
    assert (await hung_http.get("/ui/jobs/9999")).status_code == 404
