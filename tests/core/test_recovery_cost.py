"""Recovery chosen by its cost (issue 42; core/recovery_cost.py): each path's estimated
GPU-hours lost (the job's GPUs × (seconds to stepping again + work since its newest
checkpoint)), the cheapest possible path taken, and the plans on the requeue step's result
and in its description (what the incident, the Temporal UI and Slack show)."""

from __future__ import annotations

import time

import pytest

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.ladder_figures import LadderFigures, RungFigures
from autoclusters.core.models import RequeueResult
from autoclusters.core.policy import Policy, default_policy
from autoclusters.core.recovery_capacity import capacity_for
from autoclusters.core.recovery_cost import (
    JobFacts,
    RecoveryCapacity,
    RecoveryFigures,
    plan_recovery,
    recovery_text,
)
from tests.activities.test_in_job_recovery import SPARE, _input, run
from tests.fakes.systems import FakeSlurm

FIGURES = RecoveryFigures(in_job_s=1.5, requeue_s=20)


def test_in_job_is_taken_where_possible_and_cheapest() -> None:
    plan = plan_recovery(JobFacts(job_id=7, gpus=16, checkpoint_age_s=240), FIGURES)
    assert plan.chosen == "in-job"
    in_job, requeue = plan.estimate("in-job"), plan.estimate("requeue")
    assert in_job is not None and requeue is not None
    assert in_job.gpu_hours == pytest.approx(16 * 1.5 / 3600)
    # The requeue restarts from the checkpoint: its 240 s of work are done again.
    assert (requeue.resume_s, requeue.redo_s) == (20, 240)
    assert requeue.gpu_hours == pytest.approx(16 * (20 + 240) / 3600)
    assert "cheapest" in plan.why


def test_a_job_that_cannot_recover_in_place_is_requeued_and_says_why() -> None:
    facts = JobFacts(job_id=8, gpus=8, checkpoint_age_s=10, in_job_blocked="the batch host")
    plan = plan_recovery(facts, FIGURES)
    assert plan.chosen == "requeue" and "in-job not possible: the batch host" in plan.why
    in_job = plan.estimate("in-job")
    assert in_job is not None and not in_job.possible and in_job.why_not == "the batch host"
    assert "not possible (the batch host)" in plan.describe()


def test_the_cluster_figures_decide_a_tie_or_a_slower_in_place_recovery() -> None:
    """A cluster whose in-place re-forming takes longer than a requeue from a fresh
    checkpoint requeues: the figures, not a fixed preference, decide."""
    slow = RecoveryFigures(in_job_s=30, requeue_s=20)
    fresh = plan_recovery(JobFacts(job_id=9, gpus=8, checkpoint_age_s=5), slow)
    assert fresh.chosen == "requeue" and "cheapest" in fresh.why
    old = plan_recovery(JobFacts(job_id=9, gpus=8, checkpoint_age_s=60), slow)
    assert old.chosen == "in-job"  # 30 s in place against 20 + 60 s


def test_an_unknown_checkpoint_age_is_said_not_guessed() -> None:
    plan = plan_recovery(JobFacts(job_id=10, gpus=4), FIGURES)
    requeue = plan.estimate("requeue")
    assert requeue is not None and requeue.redo_s == 0
    assert "checkpoint age unknown" in plan.why


def test_slack_is_told_each_jobs_choice_and_estimates() -> None:
    plans = [
        plan_recovery(JobFacts(job_id=7, gpus=16, checkpoint_age_s=240), FIGURES),
        plan_recovery(JobFacts(job_id=8, gpus=8, in_job_blocked="no standby"), FIGURES),
    ]
    text = recovery_text(plans)
    assert "job 7: in-job (in-job 0.00667 GPU-h; requeue 1.16 GPU-h; spare not possible" in text
    assert "job 8: requeue (in-job not possible (no standby); requeue 0.0444 GPU-h;" in text
    # Every path is told, the impossible ones with why.
    assert "borrow not possible (this cluster does not borrow); repair 2.04 GPU-h" in text


def test_the_shipped_policy_announces_and_a_bare_one_does_not() -> None:
    """An incident opened before the field existed replays with False: no new command."""
    assert default_policy().announce_recovery is True
    assert Policy().announce_recovery is False
    assert default_policy().recovery_figures == FIGURES
    assert default_policy().measure_recovery is True and Policy().measure_recovery is False


def test_the_requeue_step_plans_every_job_it_recovers() -> None:
    """The requeue step (activities/in_job.py, activities/slurm.py) plans each job on the
    node from Slurm's view of it: its width and its checkpoint's age (`ckpt_at=`)."""
    slurm = FakeSlurm()
    for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
        slurm.add_node(n)  # gpu-4 runs nothing: job 10 can start again on it at once
    saved = time.time() - 100
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"ckpt_at={saved:.0f} {SPARE}")
    slurm.in_job_recovering.add(7)
    slurm.add_job(10, nodes="gpu-[2-3]", comment=f"ckpt_at={saved:.0f}")
    out: RequeueResult = run(SlurmActivities(slurm).requeue_jobs, _input("gpu-2", "inc-1", True, 5))
    plans = {p.job_id: p for p in out.plans}
    assert plans[7].chosen == "in-job" and out.recovery_path()[7] == "in-job"
    assert plans[10].chosen == "requeue" and out.requeued == [10]
    assert "no standby" in plans[10].why
    age = plans[10].checkpoint_age_s
    assert age is not None and 99 <= age <= 160
    assert plans[10].gpus == 2  # no GPUs asked for: its nodes
    assert plans[10].restart_cnt == 0 and plans[10].checkpoint_at == float(f"{saved:.0f}")
    assert "plan job 7: in-job" in out.describe() and "plan job 10: requeue" in out.describe()


def test_the_slack_card_shows_the_estimates_and_keeps_its_repair() -> None:
    from autoclusters.core.models import Notification
    from autoclusters.integrations.slack.cards import IncidentCard, Links, card_message

    def note(event: str, text: str) -> Notification:
        return Notification(
            incident_id="INC-7", cluster="c1", node="gpu-01", fault="XID_79", event=event,
            text=text,
        )  # fmt: skip

    opened = note("opened", "XID_79 on gpu-01: plan reboot (mode auto)")
    plans = [plan_recovery(JobFacts(job_id=7, gpus=16, checkpoint_age_s=240), FIGURES)]
    card = (
        IncidentCard.for_note(opened)
        .apply(opened)
        .apply(note("recovery_chosen", recovery_text(plans)))
    )
    assert card.rung == "reboot" and card.state == "jobs recovering"
    fallback, blocks = card_message(card, Links())
    shown = str(blocks)
    assert "job 7: in-job" in shown and "requeue 1.16 GPU-h" in shown
    assert ":repeat:" in shown and "jobs recovering" in fallback


def test_every_path_the_policy_allows_is_estimated_and_the_cheapest_taken() -> None:
    """No free node to start again on: a requeue would wait. The job is estimated on a hot
    spare, on a node borrowed from inference and on its own node after the repair, each
    redoing the 240 s since its checkpoint, and the cheapest is taken."""
    figures = RecoveryFigures(in_job_s=1.5, requeue_s=20, spare_s=45, borrow_s=30, repair_s=600)
    job = JobFacts(job_id=7, gpus=16, checkpoint_age_s=240, in_job_blocked="no standby",
                   free_nodes=0)  # fmt: skip
    plan = plan_recovery(job, figures, RecoveryCapacity(spare_blocked=None))
    cost = {e.path: e.gpu_hours for e in plan.estimates if e.possible}
    assert cost == pytest.approx({
        "spare": 16 * (45 + 240) / 3600,
        "borrow": 16 * (30 + 240) / 3600,
        "repair": 16 * (600 + 20 + 240) / 3600,  # the repair, then the job's restart
    })  # fmt: skip
    requeue = plan.estimate("requeue")
    assert requeue is not None and requeue.why_not == "0 free node(s), it needs 1"
    assert plan.chosen == "borrow" and "(spare)" in plan.why  # the runner-up is named
    # With a free node the plain requeue is cheapest again.
    free = plan_recovery(job.model_copy(update={"free_nodes": 2}), figures)
    assert free.chosen == "requeue"


def test_without_spare_or_borrowing_the_job_waits_for_the_repair_the_history_measured() -> None:
    figures = RecoveryFigures(in_job_s=1.5, requeue_s=20)
    job = JobFacts(job_id=8, gpus=8, checkpoint_age_s=60, in_job_blocked="no standby",
                   free_nodes=0)  # fmt: skip
    cap = RecoveryCapacity(repair_s=95.0, repair_from="median of 4 reboot of XID_79")
    plan = plan_recovery(job, figures, cap)
    assert plan.chosen == "repair" and "repair 95s (median of 4 reboot of XID_79)" in plan.why
    repair = plan.estimate("repair")
    assert repair is not None and repair.gpu_hours == pytest.approx(8 * (95 + 20 + 60) / 3600)
    # No history: the figures' repair_s.
    plain = plan_recovery(job, figures).estimate("repair")
    assert plain is not None and plain.resume_s == figures.repair_s + figures.requeue_s


def test_the_capacity_comes_from_the_policy_and_the_cluster_history() -> None:
    bare = capacity_for(Policy(), "XID_79", "replace")
    assert bare.spare_blocked == "the policy lists no hot spare" and bare.repair_s is None
    spares = Policy.model_validate({"guard": {"spares": ["gpu-09"]}})
    assert capacity_for(spares, "XID_79", "replace").spare_blocked is None
    rebooting = capacity_for(spares, "XID_79", "reboot").spare_blocked
    assert rebooting is not None and "rung is reboot" in rebooting
    ladder = LadderFigures(rows=[RungFigures(fault="XID_79", rung="reboot", attempts=5,
                                             successes=4, median_capacity_s=310.0)])  # fmt: skip
    known = capacity_for(spares.model_copy(update={"ladder": ladder}), "XID_79", "reboot")
    assert known.repair_s == 310.0 and "median of 4 reboot of XID_79" in known.repair_from
    assert capacity_for(spares, "ECC_DBE", "reboot").repair_s is None


def test_a_requeue_after_a_failed_in_place_recovery_is_judged_by_its_own_estimate() -> None:
    """The plan chose in place; the job fell back to the requeue: its loss is judged
    against the cheapest possible path other than in place, not the in-job estimate."""
    job = JobFacts(job_id=7, gpus=16, checkpoint_age_s=240, free_nodes=3)
    plan = plan_recovery(job, FIGURES)
    assert plan.chosen == "in-job"
    fell_back = plan.expected_for("requeue")
    assert fell_back is not None and fell_back.path == "requeue"
    in_place = plan.expected_for("in-job")
    assert in_place is not None and in_place.path == "in-job"


def test_the_checkpoints_age_is_counted_to_the_fault_not_to_the_plan() -> None:
    """The job stopped making progress at the fault: the work redone is since its
    checkpoint until then, not until the requeue step planned a second or two later."""
    slurm = FakeSlurm()
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        slurm.add_node(n)
    saved = float(int(time.time()) - 100)
    slurm.add_job(10, nodes="gpu-[1-2]", comment=f"ckpt_at={saved:.0f}")
    inp = _input("gpu-2", "inc-1", False, 5).model_copy(update={"fault_at": saved + 40})
    out: RequeueResult = run(SlurmActivities(slurm).requeue_jobs, inp)
    (plan,) = out.plans
    assert plan.checkpoint_age_s == 40 and plan.checkpoint_at == saved
    requeue = plan.estimate("requeue")
    assert requeue is not None and requeue.possible and requeue.redo_s == 40  # gpu-3 is free
