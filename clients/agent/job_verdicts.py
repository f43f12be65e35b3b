"""The jobs' progress judged job by job: each with its own thresholds, a hung one with stacks.

The rules (progress_rules.py) judge one set of ranks with one set of thresholds. The
agent's settings give the defaults; the cluster policy's `job_thresholds`
(core/job_thresholds.py) override them for the jobs an entry matches, by the Slurm job's
name, partition or account that its ranks write. So each job is judged on its own, with
its own thresholds, and the verdicts and this node's findings are put together again. A
job's own `hang_floor_s` (in its rank files) still takes the floor's place, as the rules
say.

A JOB_HANG that names a rank on this node carries the Python stacks of the job's ranks here
(clients/agent/stacks.py), dumped once per stall (the job's run and its last step), not at
every progress check while it lasts; on the first of that job's subjects, to keep the
report's evidence under its size bound.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from autoclusters.clients.agent import stacks
from autoclusters.clients.agent.classify import Finding
from autoclusters.clients.agent.progress_rules import (
    JOB_HANG,
    JobStall,
    ProgressThresholds,
    Verdicts,
    evaluate,
    findings_for,
)
from autoclusters.core.job_progress import RankProgress
from autoclusters.core.job_thresholds import JobThresholds, thresholds_for

StallKey = tuple[str, int, int, int]  # job, restart, generation, its newest step


def job_thresholds(
    base: ProgressThresholds, entries: Iterable[JobThresholds], ranks: list[RankProgress]
) -> ProgressThresholds:
    """The job's thresholds: the first policy entry matching it over the agent's own."""
    ident = next((r for r in ranks if r.job_name or r.partition or r.account), None)
    if ident is None:
        return base
    entry = thresholds_for(
        entries, name=ident.job_name, partition=ident.partition, account=ident.account
    )
    if entry is None:
        return base
    given = {
        k: getattr(entry, k)
        for k in ("hang_floor_s", "hang_k", "slow_ratio", "slow_window")
        if getattr(entry, k) is not None
    }
    return dataclasses.replace(base, **given)


class JobVerdicts:
    """One agent's judge of its jobs (one per agent: it remembers the stacks it dumped)."""

    def __init__(
        self,
        node: str,
        base: ProgressThresholds,
        entries: list[JobThresholds],
        *,
        py_spy: str | None,
        stack_dumps: bool = True,
    ) -> None:
        self.node = node
        self.base = base
        self.entries = entries
        self.py_spy = py_spy
        self.stack_dumps = stack_dumps
        self._stacks: dict[StallKey, dict[str, Any]] = {}

    def judge(
        self,
        ranks: Iterable[RankProgress],
        now: float,
        *,
        gone: Callable[[RankProgress], bool] = lambda _r: False,
    ) -> tuple[Verdicts, dict[str, Finding]]:
        by_job: dict[str, list[RankProgress]] = defaultdict(list)
        for r in ranks:
            by_job[r.job].append(r)
        verdicts, findings = Verdicts(), dict[str, Finding]()
        stalls: set[StallKey] = set()
        for job in sorted(by_job):
            th = job_thresholds(self.base, self.entries, by_job[job])
            v = evaluate(by_job[job], now, th, gone=gone)
            verdicts.stalls += v.stalls
            verdicts.slow += v.slow
            verdicts.thresholds.update(v.thresholds)
            verdicts.ranks += v.ranks
            found = findings_for(self.node, v, th)
            if JOB_HANG in found and self.stack_dumps:
                for stall in v.stalls:
                    stalls.add(self._with_stacks(stall, found[JOB_HANG]))
            for kind, f in found.items():
                mine = findings.setdefault(kind, Finding(kind, immediate=f.immediate))
                mine.subjects += f.subjects
                mine.messages += f.messages
                mine.episodes += f.episodes
        # Forget the stacks of stalls that ended (the job stepped, or is gone).
        self._stacks = {k: v for k, v in self._stacks.items() if k in stalls}
        return verdicts, findings

    def _with_stacks(self, stall: JobStall, finding: Finding) -> StallKey:
        first = stall.ranks[0]
        key = (stall.job, first.restart, first.generation, max(r.step for r in stall.ranks))
        subjects = [s for s in finding.subjects if s.get("job") == stall.job]
        if not subjects:
            return key
        if key not in self._stacks:
            here = {r.rank: r.pid for r in stall.ranks if r.node == self.node and r.pid}
            culprits = [r.rank for r in stall.culprits]
            self._stacks[key] = stacks.stacks_evidence(self.py_spy, here, culprits)
        subjects[0]["stacks"] = self._stacks[key]
        return key
