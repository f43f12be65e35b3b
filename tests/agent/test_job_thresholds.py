"""Per-job thresholds of the silent-fault rules in the cluster policy (issue 40 item 3).

Aspects:
- the policy's `job_thresholds`: loaded from YAML; a typo, an entry that names no jobs or
  sets nothing fails the load, naming the field;
- matching: the first entry wins, every pattern given must match, a job whose name,
  partition or account is unknown matches no pattern on it;
- the rank files carry the Slurm job's name, partition and account;
- the agent applies them job by job (its policy_file): a floor the policy raises for one
  job keeps its stall from being a hang while another job's same stall is one; a slow
  ratio raised for a job keeps its straggler unnamed; a job's own `hang_floor_s` still
  takes the floor's place.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.job_verdicts import JobVerdicts, job_thresholds
from autoclusters.clients.agent.progress_rules import JOB_HANG, SLOW_NODE, ProgressThresholds
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.job_progress import ENV_DIR, JobProgress, RankProgress, read_progress
from autoclusters.core.job_thresholds import JobThresholds, thresholds_for
from autoclusters.core.policy import PolicyError, parse_policy
from tests.agent.test_agent_faults import T0
from tests.agent.test_job_progress import NODES, rank, straggling
from tests.fakes.systems import ReportSink

TH = ProgressThresholds()
POLICY = """
job_thresholds:
  - name: "llama-*"
    partition: train
    hang_floor_s: 120
    hang_k: 8
  - account: research
    slow_ratio: 3.0
    slow_window: 20
  - name: "llama-*"
    hang_floor_s: 40
"""


def named(ranks: list[RankProgress], **ident: str | None) -> list[RankProgress]:
    return [dataclasses.replace(r, **ident) for r in ranks]


def test_the_policy_loads_them_and_refuses_what_says_nothing() -> None:
    entries = parse_policy(POLICY).job_thresholds
    assert [(e.name, e.partition, e.account) for e in entries] == [
        ("llama-*", "train", None), (None, None, "research"), ("llama-*", None, None),
    ]  # fmt: skip
    assert entries[0].hang_floor_s == 120 and entries[1].slow_window == 20
    for bad, says in (
        ("job_thresholds:\n  - name: x\n    hang_flor_s: 5\n", "hang_flor_s"),
        ("job_thresholds:\n  - hang_floor_s: 5\n", "name the jobs"),
        ("job_thresholds:\n  - name: x\n", "set at least one"),
        ("job_thresholds:\n  - name: x\n    slow_ratio: 1\n", "slow_ratio"),
    ):
        with pytest.raises(PolicyError, match=says):
            parse_policy(bad)


def test_the_first_entry_that_matches_wins() -> None:
    entries = parse_policy(POLICY).job_thresholds
    pick = lambda **kw: thresholds_for(entries, **({"name": None, "partition": None,  # noqa: E731
                                                    "account": None} | kw))  # fmt: skip
    assert pick(name="llama-70b", partition="train") is entries[0]
    assert pick(name="llama-70b", partition="debug") is entries[2]
    assert pick(name="llama-70b", account="research") is entries[1]
    assert pick(name="Llama-70b") is None  # case-sensitive, as Slurm's names are
    assert pick(account="ops") is None and pick() is None
    assert (
        JobThresholds(partition="train", hang_k=2).matches(name="x", partition=None, account=None)
        is False
    )  # an unknown partition matches no pattern on it


def test_the_rank_files_carry_the_slurm_jobs_name_partition_account(tmp_path: Path) -> None:
    env = {
        ENV_DIR: str(tmp_path), "SLURM_JOB_ID": "91", "SLURM_JOB_NAME": "llama-70b",
        "SLURM_JOB_PARTITION": "train", "SLURM_JOB_ACCOUNT": "research",
    }  # fmt: skip
    p = JobProgress(env=env, heartbeat=False)
    p.step(1)
    [read] = read_progress(tmp_path)
    assert (read.job_name, read.partition, read.account) == ("llama-70b", "train", "research")
    p.close()


def test_the_jobs_thresholds_over_the_agents() -> None:
    entries = parse_policy(POLICY).job_thresholds
    ranks = named([rank(i, n) for i, n in enumerate(NODES)], job_name="llama-7b")
    th = job_thresholds(TH, entries, ranks)
    assert (th.hang_floor_s, th.hang_k, th.slow_ratio) == (40, TH.hang_k, TH.slow_ratio)
    assert job_thresholds(TH, entries, [rank(i, n) for i, n in enumerate(NODES)]) is TH


def _stuck(job: str, **ident: str | None) -> list[RankProgress]:
    """Rank 3 outside the all-reduce the others wait in; 30 s without a step."""
    ranks = [rank(i, n, inside=i != 3, written_at=T0 + 29) for i, n in enumerate(NODES)]
    return [dataclasses.replace(r, job=job, **ident) for r in ranks]


def test_the_agent_judges_each_job_with_its_own(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    settings = AgentSettings(progress_dir=tmp_path / "progress", policy_file=policy)
    agent = Agent(node="gpu-02", settings=settings, backend=None, infiniband=None,
                  sink=ReportSink(), alive=lambda pid: True)  # fmt: skip
    judge = agent.jobs
    assert len(judge.entries) == 3 and judge.base == TH
    ranks = _stuck("101", job_name="llama-7b") + _stuck("102", job_name="bert")
    v, found = judge.judge(ranks, T0 + 30)
    # The same 30 s: over the agent's 25 s floor for bert, under the policy's 40 s for llama.
    assert {s["job"] for s in found[JOB_HANG].subjects} == {"102"}
    assert v.thresholds == {"101": 40.0, "102": 25.0}
    # A job's own floor still takes the floor's place.
    own = [dataclasses.replace(r, hang_floor_s=20.0) for r in _stuck("101", job_name="llama-7b")]
    assert judge.judge(own, T0 + 30)[0].thresholds == {"101": 20.0}


def test_a_slow_ratio_raised_for_a_job_keeps_its_straggler_unnamed() -> None:
    entries = parse_policy(POLICY).job_thresholds
    judge = JobVerdicts("gpu-02", TH, entries, py_spy=None)
    plain = straggling(2.0, 20)
    research = named(plain, account="research")
    assert SLOW_NODE in judge.judge(plain, T0 + 1)[1]
    assert judge.judge(research, T0 + 1)[1] == {}  # 2x < its 3.0 ratio


def test_a_policy_file_that_does_not_load_stops_the_agent(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("job_thresholds:\n  - name: x\n    hang_flor_s: 5\n")
    settings = AgentSettings(progress_dir=tmp_path, policy_file=policy)
    with pytest.raises(PolicyError, match="hang_flor_s"):
        Agent(node="gpu-02", settings=settings, backend=None, infiniband=None,
              sink=ReportSink())  # fmt: skip


def test_the_judges_findings_name_the_job_runs_they_are_about() -> None:
    """What the debouncer tells one fault from the next by (debounce.py: another job run is
    another fault): the judge keeps each rule's episodes when it puts the jobs together.
    bench/silent.py lost two trials to the judge dropping them (the old run still firing)."""
    judge = JobVerdicts("gpu-02", TH, [], py_spy=None)
    one = straggling(2.0, 10)
    other = [dataclasses.replace(r, job="4343", restart=1) for r in straggling(2.0, 10)]
    found = judge.judge(one + other, T0 + 1)[1]
    assert sorted(found[SLOW_NODE].episodes) == ["4242/0/0", "4343/1/0"]
