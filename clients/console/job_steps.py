"""Training jobs' step time per rank, with the hung or slow rank marked (issue 40).

The node page shows the jobs on the node, the job page a whole job: each rank's last
step, its step time and busy time (outside collectives and declared pauses), and how long
since it stepped. The figures are the agent's metrics as Prometheus holds them
(`autoclusters_job_*`, clients/agent/progress_series.py; instant queries by `Hostname` or
`job_id`): every rank of every job, the healthy ones too, as of the last scrape, so the
straggler is seen beside its peers. The marks are the product's verdict, not a second
one: the open JOB_HANG and SLOW_NODE incidents' evidence (the agent's subjects) says which
rank or node was named and why (the rule and its figures).

No Prometheus configured, or not answering: the page says so, and the named ranks still
show with the figures their incident's evidence carries.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from pydantic import BaseModel, Field

from autoclusters.core.models import IncidentState
from autoclusters.integrations.prometheus import PrometheusUnavailable, api_data

PREFIX = "autoclusters_job_"
# The series read, by the field each fills.
SERIES = {
    "step": PREFIX + "last_step",
    "step_s": PREFIX + "step_seconds",
    "busy_s": PREFIX + "step_busy_seconds",
    "since_step_s": PREFIX + "seconds_since_step",
}
THRESHOLD = PREFIX + "hang_threshold_seconds"
SILENT_FAULTS = ("JOB_HANG", "SLOW_NODE")


class RankStep(BaseModel):
    job: str
    rank: int
    node: str
    step: int | None = None
    step_s: float | None = None
    busy_s: float | None = None
    since_step_s: float | None = None
    mark: str | None = None  # "hung" or "slow": named by an open incident
    why: str = ""  # the rule and its figures
    incident_id: str | None = None


class JobSteps(BaseModel):
    job: str
    hang_threshold_s: float | None = None
    ranks: list[RankStep] = Field(default_factory=list)


class StepsView(BaseModel):
    configured: bool  # a Prometheus to read
    error: str | None = None  # it did not answer: why
    jobs: list[JobSteps] = Field(default_factory=list)


def _hang_why(s: dict[str, Any]) -> str:
    return (
        f"JOB_HANG, rule {s.get('rule')}: no step for {s.get('stalled_s')} s "
        f"(threshold {s.get('threshold_s')} s); heartbeat {s.get('heartbeat_age_s')} s old, "
        f"{'inside' if s.get('in_collective') else 'outside'} the collective"
    )


def _slow_why(s: dict[str, Any]) -> str:
    steps = s.get("steps") or []
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "its last steps"
    return (
        f"SLOW_NODE, rule {s.get('rule')}: {s.get('ratio')}x the other nodes' busy time "
        f"(>= {s.get('slow_ratio')}) on {span}"
    )


def marks(incidents: list[IncidentState]) -> dict[tuple[str, int], RankStep]:
    """(job, rank) -> the rank as its open silent-fault incident named it, from the agent's
    evidence (the latest account of each fault)."""
    out: dict[tuple[str, int], RankStep] = {}
    for inc in incidents:
        if inc.status != "open":
            continue
        for seen in inc.faults:
            if seen.fault not in SILENT_FAULTS or not seen.evidence:
                continue
            subjects = seen.evidence[-1].readings.get("subjects")
            for s in subjects if isinstance(subjects, list) else []:
                if not isinstance(s, dict) or "job" not in s:
                    continue
                job, node = str(s["job"]), str(s.get("node", inc.request.node))
                inc_id = inc.request.incident_id
                if seen.fault == "JOB_HANG" and isinstance(s.get("rank"), int):
                    out[(job, s["rank"])] = RankStep(
                        job=job, rank=s["rank"], node=node, step=s.get("step"), mark="hung",
                        why=_hang_why(s), incident_id=inc_id,
                    )  # fmt: skip
                elif seen.fault == "SLOW_NODE":
                    busy = s.get("node_busy_s") or [None]
                    for r in s.get("ranks") or []:
                        if isinstance(r, int):
                            out[(job, r)] = RankStep(
                                job=job, rank=r, node=node, busy_s=busy[-1], mark="slow",
                                why=_slow_why(s), incident_id=inc_id,
                            )  # fmt: skip
    return out


async def _vectors(http: httpx.AsyncClient, root: str, selector: str) -> dict[str, list[Any]]:
    """Each series' samples for `selector` (a PromQL label matcher), in one instant query:
    the node page polls every 2 s."""
    names = "|".join([*SERIES.values(), THRESHOLD])
    query = f'{{__name__=~"{names}",{selector}}}'
    data = await api_data(http, root, "/api/v1/query", {"query": query})
    result = data.get("result")
    if data.get("resultType") != "vector" or not isinstance(result, list):
        raise PrometheusUnavailable(f"{query}: not a vector ({data.get('resultType')})")
    got: dict[str, list[Any]] = {}
    for sample in result:
        got.setdefault(str(sample["metric"].get("__name__")), []).append(sample)
    return got


def _assemble(got: dict[str, list[Any]], named: dict[tuple[str, int], RankStep]) -> list[JobSteps]:
    ranks: dict[tuple[str, int], RankStep] = {}
    thresholds: dict[str, float] = {}
    for field, name in SERIES.items():
        for sample in got.get(name, []):
            labels, value = sample.get("metric", {}), float(sample["value"][1])
            key = (str(labels.get("job_id")), int(labels.get("rank")))
            row = ranks.setdefault(
                key, RankStep(job=key[0], rank=key[1], node=str(labels.get("Hostname", "?")))
            )
            setattr(row, field, int(value) if field == "step" else round(value, 3))
    for sample in got.get(THRESHOLD, []):
        thresholds[str(sample["metric"].get("job_id"))] = float(sample["value"][1])
    for key, n in named.items():
        if key not in ranks:
            ranks[key] = n.model_copy()
        else:
            seen = ranks[key]
            seen.mark, seen.why, seen.incident_id = n.mark, n.why, n.incident_id
    by_job: dict[str, JobSteps] = {}
    for key in sorted(ranks, key=lambda k: (k[0], k[1])):
        job = by_job.setdefault(
            key[0], JobSteps(job=key[0], hang_threshold_s=thresholds.get(key[0]))
        )
        job.ranks.append(ranks[key])
    return list(by_job.values())


def _label(value: str) -> str:
    # A PromQL string literal: the node name or job id is the caller's input.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def read_steps(
    http: httpx.AsyncClient,
    base_url: str | None,
    incidents: list[IncidentState],
    *,
    node: str | None = None,
    job: str | None = None,
) -> StepsView:
    """The jobs on `node` (every rank of each, on any node), or the job `job`."""
    named = marks(incidents)
    if node is not None:
        named = {k: v for k, v in named.items() if v.node == node}
    if job is not None:
        named = {k: v for k, v in named.items() if k[0] == job}
    if not base_url:
        return StepsView(configured=False, jobs=_assemble({}, named))
    root = base_url.rstrip("/")
    try:
        if job is not None:
            got = await _vectors(http, root, f'job_id="{_label(job)}"')
        else:
            here = await _vectors(http, root, f'Hostname="{_label(node or "")}"')
            jobs = sorted({str(s["metric"].get("job_id")) for v in here.values() for s in v})
            pattern = "|".join(re.escape(j) for j in jobs)
            got = await _vectors(http, root, f'job_id=~"{_label(pattern)}"') if jobs else here
        return StepsView(configured=True, jobs=_assemble(got, named))
    except (PrometheusUnavailable, KeyError, TypeError, ValueError, IndexError) as e:
        return StepsView(configured=True, error=str(e), jobs=_assemble({}, named))
