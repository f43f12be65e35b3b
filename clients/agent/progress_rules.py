"""Silent faults from the jobs' progress: a hung job's culprit (JOB_HANG) and a slow node
(SLOW_NODE). Pure functions over the rank files the agent read (core/job_progress.py) and
the time; no I/O.

What the agent sees of a job is what its progress directory holds: the node's own ranks
when the directory is node-local (then the rules compare a node's ranks among themselves),
every rank when the job's directory is shared by its nodes (then they compare across the
job). A verdict never names a rank by itself alone: there is always a contrast with the
job's other ranks, so a job that pauses as a whole (a checkpoint, an evaluation, a data
loader everyone waits for) is never a node's fault.

Hang. The job stalls when none of its ranks has stepped for its threshold:
`max(floor, hang_k x the p`hang_quantile` of its recent step times)` (the job's own tail:
its periodic saves and slow steps raise it), and no rank declared a pause (`paused`) that
is younger than `pause_max_s`. The culprit, by the first rule that names one:

1. `heartbeat`: ranks whose file stopped being written (stale for `max(heartbeat_stale_s,
   3 x its heartbeat)`) while other ranks' are fresh: the process is frozen.
2. `not_in_collective`: ranks outside a collective while the others wait inside one.
3. `behind`: ranks behind the others' step and collective count.

Straggler. Per step, a node's busy time (its ranks' median time outside collectives and
pauses: in a synchronous job every rank's wall step time is the same, the slow one's
peers wait for it inside the collective) against the median busy time of the job's ranks
on other nodes: `>= slow_ratio` on each of the last `slow_window` steps they share.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoclusters.clients.agent.classify import Finding
from autoclusters.core.job_progress import RankProgress

JOB_HANG, SLOW_NODE = "JOB_HANG", "SLOW_NODE"
PROGRESS_KINDS = (JOB_HANG, SLOW_NODE)


@dataclass(frozen=True)
class ProgressThresholds:
    """The agent's settings for these rules (clients/agent/settings.py says why each)."""

    hang_k: float = 5.0
    hang_quantile: float = 0.95
    hang_floor_s: float = 25.0
    heartbeat_stale_s: float = 15.0
    pause_max_s: float = 1800.0
    slow_ratio: float = 1.5
    slow_window: int = 10
    slow_min_busy_s: float = 0.05
    forget_s: float = 3600.0


@dataclass(frozen=True)
class JobStall:
    """A job none of whose ranks stepped for its threshold; `culprits` may be empty (the
    whole job paused together: nobody to name)."""

    job: str
    stalled_s: float
    threshold_s: float
    tail_s: float | None
    rule: str | None
    culprits: tuple[RankProgress, ...]
    ranks: tuple[RankProgress, ...]
    now: float

    def subjects(self, node: str) -> list[dict[str, Any]]:
        others = [r for r in self.ranks if r not in self.culprits]
        peers = {
            "ranks": len(self.ranks),
            "in_collective": sum(r.in_collective for r in others),
            "max_step": max((r.step for r in self.ranks), default=0),
            "max_collectives": max((r.collectives for r in self.ranks), default=0),
            "heartbeat_age_s": _round(min((self.now - r.written_at for r in others), default=None)),
        }  # fmt: skip
        return [
            {
                "job": self.job,
                "rank": r.rank,
                "node": r.node,
                "rule": self.rule,
                "stalled_s": _round(self.stalled_s),
                "threshold_s": _round(self.threshold_s),
                "step_tail_s": _round(self.tail_s),
                "step": r.step,
                "collectives": r.collectives,
                "in_collective": r.in_collective,
                "collective": r.collective,
                "in_collective_s": _round(self.now - r.collective_since)
                if r.collective_since is not None
                else None,
                "heartbeat_age_s": _round(self.now - r.written_at),
                "pid": r.pid,
                "others": peers,
            }  # fmt: skip
            for r in self.culprits
            if r.node == node
        ]

    def message(self, node: str) -> str:
        named = ", ".join(str(r.rank) for r in self.culprits if r.node == node)
        why = {
            "heartbeat": "its heartbeat stopped while the others' go on",
            "not_in_collective": "outside the collective the others wait in",
            "behind": "behind the others' step and collective count",
        }.get(self.rule or "", "")
        return (
            f"job {self.job} made no step for {self.stalled_s:.0f}s (threshold "
            f"{self.threshold_s:.0f}s): rank {named} on {node} {why}"
        )


@dataclass(frozen=True)
class SlowNode:
    job: str
    node: str
    ratio: float  # the smallest ratio over the window
    steps: tuple[int, ...]
    node_busy_s: tuple[float, ...]
    peers_busy_s: tuple[float, ...]
    ranks: tuple[int, ...]
    run: str = ""  # the job's run judged: job/restart/generation

    def subject(self, slow_ratio: float) -> dict[str, Any]:
        return {
            "job": self.job, "node": self.node, "ranks": list(self.ranks),
            "rule": "slow_steps", "ratio": _round(self.ratio), "slow_ratio": slow_ratio,
            "steps": list(self.steps), "node_busy_s": [_round(b) for b in self.node_busy_s],
            "peers_busy_s": [_round(b) for b in self.peers_busy_s],
        }  # fmt: skip

    def message(self) -> str:
        return (
            f"job {self.job}: {self.node}'s ranks took >= {self.ratio:.2f}x the other nodes' "
            f"median busy time per step for {len(self.steps)} steps "
            f"({self.steps[0]}-{self.steps[-1]})"
        )


@dataclass
class Verdicts:
    stalls: list[JobStall] = field(default_factory=list)
    slow: list[SlowNode] = field(default_factory=list)
    thresholds: dict[str, float] = field(default_factory=dict)  # job -> hang threshold (s)
    ranks: list[RankProgress] = field(default_factory=list)  # the ranks judged


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def quantile(values: Iterable[float], q: float) -> float | None:
    """The nearest-rank quantile (q in (0, 1]); None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def current_jobs(
    ranks: Iterable[RankProgress],
    now: float,
    th: ProgressThresholds,
    *,
    gone: Callable[[RankProgress], bool] = lambda _r: False,
) -> dict[str, list[RankProgress]]:
    """The ranks worth judging, by job: the newest run of each job (its restart count, then
    its group's generation), without files older than `forget_s` or of processes `gone`."""
    by_job: dict[str, list[RankProgress]] = defaultdict(list)
    for r in ranks:
        if now - r.written_at <= th.forget_s and not gone(r):
            by_job[r.job].append(r)
    out: dict[str, list[RankProgress]] = {}
    for job, rs in sorted(by_job.items()):
        newest = max((r.restart, r.generation) for r in rs)
        out[job] = sorted(
            (r for r in rs if (r.restart, r.generation) == newest), key=lambda r: r.rank
        )
    return out


def run_of(ranks: Sequence[RankProgress]) -> str:
    """The job's run its ranks belong to (current_jobs keeps one run per job)."""
    r = ranks[0]
    return f"{r.job}/{r.restart}/{r.generation}"


def hang_threshold(ranks: list[RankProgress], th: ProgressThresholds) -> tuple[float, float | None]:
    """(threshold, the step-time tail it came from): the job's own floor when its ranks
    declare one (`hang_floor_s` in their files), else the agent's."""
    tail = quantile((t for r in ranks for _s, t, _b in r.recent), th.hang_quantile)
    declared = [r.hang_floor_s for r in ranks if r.hang_floor_s is not None]
    floor = max(declared) if declared else th.hang_floor_s
    return max(floor, th.hang_k * tail if tail is not None else 0.0), tail


def _stale(r: RankProgress, now: float, th: ProgressThresholds) -> bool:
    return now - r.written_at > max(th.heartbeat_stale_s, 3 * r.heartbeat_s)


def find_stall(ranks: list[RankProgress], now: float, th: ProgressThresholds) -> JobStall | None:
    """The job's stall, culprit named when a rule can; None while it steps (or has not yet,
    or says it is paused)."""
    stepped = [r.stepped_at for r in ranks if r.stepped_at is not None]
    if not stepped:
        return None  # starting: nothing to compare with
    threshold, tail = hang_threshold(ranks, th)
    stalled = now - max(stepped)
    if stalled < threshold:
        return None
    if any(r.pause_since is not None and now - r.pause_since < th.pause_max_s for r in ranks):
        return None
    rule, culprits = _culprits(ranks, now, th)
    return JobStall(ranks[0].job, stalled, threshold, tail, rule, culprits, tuple(ranks), now)


def _culprits(
    ranks: list[RankProgress], now: float, th: ProgressThresholds
) -> tuple[str | None, tuple[RankProgress, ...]]:
    frozen = [r for r in ranks if _stale(r, now, th)]
    if frozen and len(frozen) < len(ranks):
        return "heartbeat", tuple(frozen)
    live = [r for r in ranks if r not in frozen]
    inside = [r for r in live if r.in_collective]
    if inside and len(inside) < len(live):
        return "not_in_collective", tuple(r for r in live if not r.in_collective)
    ahead = max(r.position for r in live) if live else None
    behind = [r for r in live if r.position != ahead]
    if behind and len(behind) < len(live):
        return "behind", tuple(behind)
    return None, ()


def find_slow_nodes(
    ranks: list[RankProgress], now: float, th: ProgressThresholds, threshold_s: float
) -> list[SlowNode]:
    """Nodes whose ranks' busy time is >= slow_ratio x the other nodes' median on each of
    the last slow_window steps every node of the job has in its window. Only while the job
    steps (a stalled one is the hang rule's)."""
    stepped = [r.stepped_at for r in ranks if r.stepped_at is not None]
    if not stepped or now - max(stepped) >= threshold_s:
        return []
    nodes: dict[str, list[RankProgress]] = defaultdict(list)
    for r in ranks:
        nodes[r.node].append(r)
    if len(nodes) < 2:
        return []
    busy: dict[str, dict[int, list[float]]] = {n: defaultdict(list) for n in nodes}
    for r in ranks:
        for s, _t, b in r.recent:
            busy[r.node][s].append(b)
    common = set.intersection(*(set(b) for b in busy.values()))
    steps = sorted(common)[-th.slow_window :]
    if len(steps) < th.slow_window:
        return []
    out = []
    for node in sorted(nodes):
        mine, theirs, ratios = [], [], []
        for s in steps:
            m = statistics.median(busy[node][s])
            p = statistics.median([b for n in nodes if n != node for b in busy[n][s]])
            if p < th.slow_min_busy_s or m < th.slow_ratio * p:
                break
            mine.append(m)
            theirs.append(p)
            ratios.append(m / p)
        else:
            out.append(
                SlowNode(
                    ranks[0].job, node, min(ratios), tuple(steps), tuple(mine), tuple(theirs),
                    tuple(r.rank for r in nodes[node]), run_of(ranks),
                )
            )  # fmt: skip
    return out


def evaluate(
    ranks: Iterable[RankProgress],
    now: float,
    th: ProgressThresholds,
    *,
    gone: Callable[[RankProgress], bool] = lambda _r: False,
) -> Verdicts:
    v = Verdicts()
    for job, rs in current_jobs(ranks, now, th, gone=gone).items():
        v.ranks += rs
        threshold, _tail = hang_threshold(rs, th)
        v.thresholds[job] = threshold
        if (stall := find_stall(rs, now, th)) is not None:
            v.stalls.append(stall)
        v.slow += find_slow_nodes(rs, now, th, threshold)
    return v


def findings_for(node: str, v: Verdicts, th: ProgressThresholds) -> dict[str, Finding]:
    """What `node`'s agent reports: JOB_HANG when a stall names a rank on it, SLOW_NODE
    when it is slow. Immediate: the thresholds above are the debounce."""
    out: dict[str, Finding] = {}
    for stall in v.stalls:
        if subjects := stall.subjects(node):
            f = out.setdefault(JOB_HANG, Finding(JOB_HANG, immediate=True))
            f.subjects += subjects
            f.messages.append(stall.message(node))
            f.episodes.append(run_of(stall.ranks))
    for slow in v.slow:
        if slow.node == node:
            f = out.setdefault(SLOW_NODE, Finding(SLOW_NODE, immediate=True))
            f.subjects.append(slow.subject(th.slow_ratio))
            f.messages.append(slow.message())
            f.episodes.append(slow.run)
    return out
