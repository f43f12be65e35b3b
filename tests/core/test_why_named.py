"""Why the agent named a node for a silent fault, in the incident's messages and its Slack
card (issue 40 item 4; core/why_named.py).

Aspects:
- JOB_HANG: the rule, the culprit's figures (stall, threshold, heartbeat, collective), the
  others' figures, and the stack groups with the outlier named; py-spy absent, said so;
- SLOW_NODE: the rule, the ratio against its floor, the steps and the busy times;
- another fault, or readings that are not the agent's subjects: nothing;
- the Slack card of a JOB_HANG shows these lines (escaped) from the opening message.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from autoclusters.core.models import Notification
from autoclusters.core.why_named import why_named
from autoclusters.integrations.slack.cards import IncidentCard, Links, card_message

HANG = {
    "job": "4242", "rank": 3, "node": "gpu-02", "rule": "heartbeat", "stalled_s": 40.0,
    "threshold_s": 25.0, "step_tail_s": 1.02, "step": 100, "collectives": 100,
    "in_collective": False, "heartbeat_age_s": 40.0, "pid": 5123,
    "others": {"ranks": 4, "in_collective": 3, "max_step": 100, "max_collectives": 101,
               "heartbeat_age_s": 2.0},
    "stacks": {
        "tool": "py-spy",
        "groups": [
            {"ranks": [0, 1, 2], "frames": ["wait (dist.py:10)", "all_reduce (train.py:40)"]},
            {"ranks": [3], "frames": ["read (loader.py:7)", "next_batch (train.py:30)"]},
        ],
        "groups_left_out": 0, "outlier_ranks": [3], "failed": {},
    },
}  # fmt: skip
SLOW = {
    "job": "4242", "node": "gpu-02", "ranks": [2, 3], "rule": "slow_steps", "ratio": 2.01,
    "slow_ratio": 1.5, "steps": list(range(91, 101)), "node_busy_s": [2.0] * 10,
    "peers_busy_s": [0.995] * 10,
}  # fmt: skip


def test_a_hang_says_the_rule_the_figures_and_the_stack_groups() -> None:
    why, stacks = why_named("JOB_HANG", {"subjects": [HANG]}).splitlines()
    assert why.startswith("Why this node: job 4242 rank 3 (pid 5123), rule heartbeat: ")
    assert "no step for 40 s, threshold 25 s (step-time tail 1.02 s)" in why
    assert "outside the collective at step 100, heartbeat 40 s old" in why
    assert "the other 4 ranks: 3 inside, newest step 100, freshest heartbeat 2 s" in why
    assert stacks == (
        "Stacks (2 groups, py-spy): ranks [0, 1, 2]: wait (dist.py:10) < all_reduce "
        "(train.py:40); ranks [3] (outlier): read (loader.py:7) < next_batch (train.py:30)"
    )
    absent = {**HANG, "stacks": {"tool": "py-spy", "detail": "py-spy is not installed"}}
    assert why_named("JOB_HANG", {"subjects": [absent]}).endswith("Stacks: py-spy is not installed")


def test_a_slow_node_says_the_ratio_and_the_steps() -> None:
    assert why_named("SLOW_NODE", {"subjects": [SLOW]}) == (
        "Why this node: job 4242 ranks [2, 3], rule slow_steps: 2.01x the other nodes' "
        "median busy time per step (>= 1.5) on each of steps 91-100; last busy 2 s vs 0.995 s"
    )


def test_nothing_for_another_fault_or_other_readings() -> None:
    assert why_named("XID_79", {"subjects": [HANG]}) == ""
    assert why_named("JOB_HANG", {"truncated": True, "bytes": 9000}) == ""
    assert why_named("JOB_HANG", {"subjects": ["not a subject"]}) == ""


def test_the_slack_card_of_a_hang_says_why_that_node() -> None:
    hostile = {**HANG, "job": "<!channel> 4242"}
    text = (
        "JOB_HANG on gpu-02: plan reset_gpu (mode auto)\n"
        "job 4242 made no step for 40s (threshold 25s): rank 3 on gpu-02\n"
        + why_named("JOB_HANG", {"subjects": [hostile]})
    )
    note = Notification(
        incident_id="inc-20261205-120000-gpu-02", cluster="c1", node="gpu-02",
        fault="JOB_HANG", event="opened", text=text, severity="critical",
    )  # fmt: skip
    card = (
        IncidentCard.for_note(note)
        .apply(note)
        .model_copy(update={"updated_at": datetime(2026, 12, 5, tzinfo=UTC)})
    )
    _fallback, blocks = card_message(card, Links())
    shown = json.dumps(blocks)
    assert "Why this node: job &lt;!channel&gt; 4242 rank 3 (pid 5123), rule heartbeat" in shown
    assert "ranks [3] (outlier): read (loader.py:7)" in shown
    assert "<!channel>" not in shown  # outside words never ping a channel
