"""Borrowed from inference: when a remediation incident takes a training node that ran jobs
and no hot spare is free, the sharing workflow may lend one of inference's nodes to training for
the repair, and gives it back once the repaired node is in service again.

The rules, all pure (no clock, no I/O) like `decide`, so the workflow and the tests take the
same decision from the same figures:

- a node is *lost* to training when an incident (its Slurm drain reason names one) holds a
  training node that ran jobs, as last seen out of the incident or on it now;
- a borrow needs the policy (`borrow_from_inference`), a job of the lost node short of its
  width (pending, or running narrower), no free spare (a spare is the incident's remedy,
  and an unknown count is not zero), inference's demand figure at most
  `slo * (1 - borrow_headroom)` with the node still serving, and inference left with at
  least `max(1, min_inference_nodes)` nodes; the node lent is an inference node in no
  incident, not failed its gate, serving least (`pick_to_return`);
- a borrow is given back when the repaired node is in service again (the next evaluation,
  so within one interval), when inference breaches its SLO for `sustain` evaluations
  (inference first: the job narrows again), or after `borrow_max_s`; an incident on the
  borrowed node ends the borrow (the node is the runbook's); the borrowed node not
  answering with no incident's drain on it is unknown: nothing moves until it answers;
- one borrow per incident, whatever became of it: a retried evaluation never borrows twice.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel

from autoclusters.core.sharing import (
    Borrow,
    Demand,
    LostNode,
    NodeShare,
    Pool,
    SharePolicy,
    pick_to_return,
)


class BorrowVerdict(BaseModel):
    """What one evaluation does about borrowing: lend an inference node to training
    (`borrow`), give a borrowed one back (`give_back`), note that an incident took the
    borrowed node (`taken`), or nothing (None, with why)."""

    action: Literal["borrow", "give_back", "taken"] | None
    node: str | None = None  # the inference node to lend, or the borrowed node
    for_node: str | None = None  # the training node under repair
    why: str


def job_widths(demand: Demand) -> Counter[int]:
    """Each running job's width: the nodes it runs on."""
    return Counter(j for n in demand.nodes for j in set(n.jobs))


def note_lost(
    prev: Demand | None,
    now: Demand,
    lost: dict[str, LostNode],
    *,
    at: float,
    borrowed: set[str],
) -> dict[str, LostNode]:
    """The training nodes an incident holds that ran jobs, each with its jobs' widths from
    before the fault; a node back out of its incident is forgotten, a node not read this
    time is kept as it was (unread is not recovered). A borrowed node's own incident lends
    nothing more: that borrow ends instead."""
    before = {n.name: n for n in prev.nodes} if prev is not None else {}
    widths_before = job_widths(prev) if prev is not None else Counter()
    widths_now = job_widths(now)
    out: dict[str, LostNode] = {}
    for n in now.nodes:
        if not n.in_incident or n.name in borrowed:
            continue
        known = lost.get(n.name)
        if known is not None and n.incident_id in (None, known.incident_id):
            out[n.name] = known  # a reboot may show it down with no reason for a while
            continue
        if n.incident_id is None or n.pool != Pool.TRAINING:
            continue
        jobs: dict[int, int] = {}
        was = before.get(n.name)
        if was is not None and not was.in_incident:
            jobs = {j: widths_before[j] for j in was.jobs}
        for j in n.jobs:  # still there while the incident requeues it
            jobs[j] = max(jobs.get(j, 0), widths_now[j])
        if jobs:
            out[n.name] = LostNode(
                node=n.name,
                incident_id=n.incident_id,
                fault=n.incident_fault or "",
                jobs=jobs,
                seen_at=at,
            )
    seen = {n.name for n in now.nodes}
    out.update({name: node for name, node in lost.items() if name not in seen})
    return out


def short_jobs(lost: LostNode, now: Demand) -> list[int]:
    """The lost node's jobs that wait to start or run narrower than before; a job that
    ended, or got its width back (an in-job standby), needs nothing."""
    widths = job_widths(now)
    pending = set(now.pending_jobs or [])
    return sorted(j for j, w in lost.jobs.items() if j in pending or 0 < widths[j] < w)


def _back_in_service(node: str, now: Demand) -> bool | None:
    """True: in the training pool, out of any incident. None: not read this time."""
    n = next((x for x in now.nodes if x.name == node), None)
    if n is None:
        return None
    return not n.in_incident and n.pool == Pool.TRAINING


def decide_borrow(
    demand: Demand,
    policy: SharePolicy,
    *,
    lost: dict[str, LostNode],
    borrows: list[Borrow],
    barred: set[str],
    inference_breached: bool,
    now: float,
) -> BorrowVerdict:
    """One evaluation's borrowing decision. `barred`: nodes no move may take (failed their
    gate on return, yielded to an incident); `inference_breached`: the SLO breached for
    `sustain` evaluations in a row (the sharing workflow's own streak)."""
    if not policy.enabled:
        return BorrowVerdict(action=None, why="sharing is disabled by policy")
    by_name = {n.name: n for n in demand.nodes}
    unsure: BorrowVerdict | None = None
    for b in borrows:
        if b.status != "lent":
            continue
        mine = by_name.get(b.node)
        if mine is not None and mine.in_incident and mine.incident_id is None:
            # Not answering, with no incident's drain on it (slurmd restarting while the
            # cluster reconfigures): unknown, neither taken nor safe to move. Look again.
            unsure = BorrowVerdict(action=None, node=b.node, why=f"{b.node} not answering")
            continue
        if mine is not None and mine.in_incident:
            return BorrowVerdict(
                action="taken",
                node=b.node,
                for_node=b.for_node,
                why=f"incident {mine.incident_id} took {b.node}: the runbook's now",
            )
        back = _back_in_service(b.for_node, demand)
        if back:
            why = f"{b.for_node} is back in service: {b.node} returns to inference"
        elif inference_breached:
            why = f"inference breached its SLO {policy.inference.slo:g}: {b.node} returns first"
        elif b.lent_at is not None and now - b.lent_at >= policy.borrow_max_s:
            why = f"borrowed {now - b.lent_at:.0f}s, the most borrow_max_s allows"
        else:
            continue
        return BorrowVerdict(action="give_back", node=b.node, for_node=b.for_node, why=why)
    if unsure is not None:
        return unsure
    if not policy.borrow_from_inference:
        return BorrowVerdict(action=None, why="borrow_from_inference is off")
    for name in sorted(lost):
        ln = lost[name]
        if any(b.incident_id == ln.incident_id for b in borrows):
            continue  # one borrow per incident, whatever became of it
        short = short_jobs(ln, demand)
        if not short:
            continue
        node = _lendable(demand, policy, barred)
        if isinstance(node, str):
            return BorrowVerdict(action=None, for_node=name, why=node)
        jobs = ", ".join(str(j) for j in short)
        value = demand.inference_value
        return BorrowVerdict(
            action="borrow",
            node=node.name,
            for_node=name,
            why=(
                f"incident {ln.incident_id} took {name}; job(s) {jobs} short of their width, "
                f"no spare free, inference {value:.3g} <= {1 - policy.borrow_headroom:g} x "
                f"SLO {policy.inference.slo:g}"
            ),
        )
    return BorrowVerdict(action=None, why="no training node lost to an incident needs one")


def _lendable(demand: Demand, policy: SharePolicy, barred: set[str]) -> NodeShare | str:
    """The inference node to lend, or why none may be."""
    if demand.spares_free is None:
        return "free spares not known: no borrow on an unknown"
    if demand.spares_free > 0:
        return f"{demand.spares_free} spare(s) free: the incident's to use"
    value = demand.inference_value
    if value is None:
        return "no inference demand figure: no borrow on an unknown"
    limit = policy.inference.slo * (1 - policy.borrow_headroom)
    if value > limit:
        return (
            f"inference {value:.3g} above {1 - policy.borrow_headroom:g} x SLO "
            f"{policy.inference.slo:g} (borrow_headroom {policy.borrow_headroom:g})"
        )
    ok = [n for n in demand.in_pool(Pool.INFERENCE) if not n.in_incident and n.name not in barred]
    keep = max(1, policy.min_inference_nodes)
    if len(ok) - 1 < keep:
        return f"inference would keep fewer than {keep} healthy node(s)"
    node = pick_to_return(ok)
    return node if node is not None else "no healthy inference node out of incidents"
