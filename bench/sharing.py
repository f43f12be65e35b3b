"""Sharing benchmark: GPU sharing against a static split, on one modelled demand trace.

Replays a day of inference traffic, compressed into `--day-s` seconds (a diurnal request-rate
curve, trough at 02:00 and peak at 14:00 of the day, with `--bursts` bursts on top and
per-evaluation noise; deterministic from `--seed`), twice:

- **shared**: every `evaluate_every_s` the modelled p95 latency goes to
  `autoclusters.core.sharing.decide` as the demand figure, as the GpuSharing workflow
  gives it: the breach and calm streaks carried from one evaluation to the next, the seconds
  since the last move's *end*, no evaluation while a move is under way (the workflow runs
  one move at a time), and the node `decide` names moves;
- **static**: the same nodes, `--static-inference` of them serving inference for the whole
  day and the rest training.

Everything here is a model, not a measurement:

- An inference node serves `--capacity-rps` (μ); the gateway spreads the trace's λ evenly
  over the c nodes serving, and each node is an M/M/1 queue (its GPU shares itself among
  the requests it holds), so a request's response time is Exp(μ - λ/c) and
  p95 = ln(20) / (μ - λ/c) = ln(20)·(1/μ) / (1 - ρ), ρ = λ/(cμ); the fraction of requests
  within the SLO is 1 - e^(-(μ - λ/c)·SLO). Steady state within each second; a saturated
  or empty pool (ρ >= 1, or c = 0) answers no request within the SLO and its p95 is the
  `LATENCY_CAP_S` timeout.
- The demand figure `decide` sees is the p95 at the mean rate over the last `--window-s`
  seconds (the PromQL `rate(...[30s])` window) with the nodes serving now.
- Training: there is always enough pending work to fill every training node, one job per
  node, each checkpointing every `--ckpt-every-s` from its own start (the initial jobs'
  phases are staggered). Lending a node redoes the work since its job's last checkpoint
  (the worst case: a job that also saves on the checkpoint signal loses less).
- A move's durations are flags: lend = `--drain-s` (drain, checkpoint signal, requeue) +
  `--handover-s` (uncordon, label, scale, replica Ready); return = `--handover-s` (scale
  down, pod drained, cordon, relabel) + `--health-gate-s` (gate, resume in Slurm); a
  returned node then spends `--restart-s` restarting a job before it trains. The defaults
  come from the sandbox's remediation figures (docs/recovery.md: drain to job requeued
  3.0 s, back in service with no boot 6.5 s, the job's own restart 6-7 s); the handover
  is an estimate until `autoclusters demo --scenario share` measures lend_s / return_s.
  Times run on a 1 s grid; a move's end rounds up to it.

Metrics: SLO attainment over requests (the fraction of requests answered within the SLO)
and over time (the fraction of seconds whose p95 is within it); training GPU-hours done
(net of work redone); GPU utilisation (useful GPU time, training done plus the busy share
of serving nodes, over all GPU time); node moves; work lost to moves (GPU-hours redone
since the last checkpoint, and GPU-hours of nodes moving or restarting their job).

    .venv/bin/python bench/sharing.py
    .venv/bin/python bench/sharing.py --static-inference 3 --seed 7 --json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoclusters.core.sharing import (  # noqa: E402
    Demand,
    Direction,
    InferenceTarget,
    NodeShare,
    Pool,
    SharePolicy,
    decide,
)

# What a saturated queue's p95 is taken to be: the client's timeout.
LATENCY_CAP_S = 60.0


# --- the queueing model ---------------------------------------------------------------


def latency_p95(rps: float, servers: int, capacity_rps: float) -> float:
    """The p95 response time (s) of `servers` nodes of `capacity_rps` each at `rps` spread
    evenly over them: each node an M/M/1 queue, response time ~ Exp(μ - λ/c), so
    p95 = ln(20) / (μ - λ/c) = ln(20)·(1/μ) / (1 - ρ)."""
    spare = capacity_rps - rps / servers if servers > 0 else 0.0
    if spare <= 0:
        return LATENCY_CAP_S
    return min(LATENCY_CAP_S, math.log(20.0) / spare)


def within_slo(rps: float, servers: int, capacity_rps: float, slo: float) -> float:
    """The fraction of requests answered within `slo` seconds: P(Exp(μ - λ/c) <= slo)."""
    spare = capacity_rps - rps / servers if servers > 0 else 0.0
    return 1.0 - math.exp(-spare * slo) if spare > 0 else 0.0


# --- the demand trace -----------------------------------------------------------------


@dataclass(frozen=True)
class TraceSpec:
    seed: int = 1
    day_s: int = 3600  # one day's curve in this many seconds
    low_rps: float = 6.0  # the 02:00 trough
    peak_rps: float = 70.0  # the 14:00 peak
    bursts: int = 6
    burst_x: float = 1.8  # a burst multiplies the rate by up to this
    burst_s: float = 150.0  # a burst's length (seconds of the compressed day)
    noise: float = 0.08  # lognormal sigma, drawn once per evaluation interval
    noise_every_s: int = 15


def make_trace(spec: TraceSpec) -> list[float]:
    """Requests per second for each second of the compressed day."""
    rng = random.Random(spec.seed)
    starts = sorted(rng.uniform(0, spec.day_s - spec.burst_s) for _ in range(spec.bursts))
    heights = [rng.uniform(1.3, spec.burst_x) for _ in starts]
    noise = [
        rng.lognormvariate(0.0, spec.noise) for _ in range(spec.day_s // spec.noise_every_s + 1)
    ]
    rates = []
    for s in range(spec.day_s):
        x = s / spec.day_s - 14.0 / 24.0
        rate = spec.low_rps + (spec.peak_rps - spec.low_rps) * (1 + math.cos(2 * math.pi * x)) / 2
        for start, height in zip(starts, heights, strict=True):
            if start <= s < start + spec.burst_s:
                # A burst rises at once and decays back over its length.
                rate *= 1.0 + (height - 1.0) * (1.0 - (s - start) / spec.burst_s)
        rates.append(rate * noise[s // spec.noise_every_s])
    return rates


# --- the replay -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterModel:
    nodes: int = 8
    gpus_per_node: int = 8
    capacity_rps: float = 20.0  # one inference node
    ckpt_every_s: float = 120.0
    window_s: int = 30  # the demand query's rate window


@dataclass(frozen=True)
class MoveTimes:
    drain_s: float = 3.0
    handover_s: float = 10.0
    health_gate_s: float = 6.5
    restart_s: float = 6.5

    def duration(self, to: Direction) -> int:
        lend = self.drain_s + self.handover_s
        back = self.handover_s + self.health_gate_s
        return math.ceil(lend if to == "inference" else back)


@dataclass
class MoveRecord:
    node: str
    to: Direction
    start: int
    end: int
    demand: float
    redone_gpu_s: float


@dataclass
class Column:
    name: str
    requests_within_slo: float = 0.0
    time_within_slo: float = 0.0
    training_gpu_hours: float = 0.0
    gpu_utilisation: float = 0.0
    moves: int = 0
    redone_gpu_hours: float = 0.0
    moving_gpu_hours: float = 0.0
    timeline: list[MoveRecord] = field(default_factory=list)
    min_training_nodes_seen: int = 0
    max_inference_nodes_seen: int = 0

    @property
    def lost_gpu_hours(self) -> float:
        return self.redone_gpu_hours + self.moving_gpu_hours

    def summary(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "timeline"}
        out["lost_gpu_hours"] = self.lost_gpu_hours
        return out


@dataclass
class _Node:
    name: str
    pool: Pool
    job_from: float = 0.0  # the job trains (and checkpoints) from here
    moving_to: Direction | None = None
    move_end: int = 0


class _Tally:
    """Per-second sums both replays share."""

    def __init__(self, cluster: ClusterModel, slo: float) -> None:
        self.cluster, self.slo = cluster, slo
        self.requests = self.requests_ok = 0.0
        self.seconds = self.seconds_ok = 0
        self.training_gpu_s = self.inference_busy_gpu_s = 0.0

    def second(self, rps: float, serving: int, training_gpu_s: float) -> None:
        c = self.cluster
        self.requests += rps
        self.requests_ok += rps * within_slo(rps, serving, c.capacity_rps, self.slo)
        self.seconds += 1
        self.seconds_ok += latency_p95(rps, serving, c.capacity_rps) <= self.slo
        self.training_gpu_s += training_gpu_s
        self.inference_busy_gpu_s += min(rps / c.capacity_rps, serving) * c.gpus_per_node

    def fill(self, col: Column, redone_gpu_s: float, moving_gpu_s: float) -> Column:
        total_gpu_s = self.seconds * self.cluster.nodes * self.cluster.gpus_per_node
        done = self.training_gpu_s - redone_gpu_s
        col.requests_within_slo = self.requests_ok / self.requests if self.requests else 1.0
        col.time_within_slo = self.seconds_ok / self.seconds if self.seconds else 1.0
        col.training_gpu_hours = done / 3600
        col.gpu_utilisation = (done + self.inference_busy_gpu_s) / total_gpu_s
        col.redone_gpu_hours = redone_gpu_s / 3600
        col.moving_gpu_hours = moving_gpu_s / 3600
        return col


def replay_static(
    trace: list[float], policy: SharePolicy, cluster: ClusterModel, inference_nodes: int
) -> Column:
    """A fixed split: `inference_nodes` serve, the rest train, all day."""
    tally = _Tally(cluster, policy.inference.slo)
    training = cluster.nodes - inference_nodes
    for rps in trace:
        tally.second(rps, inference_nodes, training * cluster.gpus_per_node)
    col = Column(
        name=f"static ({inference_nodes} inference)",
        min_training_nodes_seen=training,
        max_inference_nodes_seen=inference_nodes,
    )
    return tally.fill(col, 0.0, 0.0)


def _last_checkpoint(node: _Node, now: float, every: float) -> float:
    if now < node.job_from:
        return now  # restarting from a checkpoint: nothing to redo yet
    return now - (now - node.job_from) % every


def _share(node: _Node, now: float, every: float) -> NodeShare:
    if node.pool == Pool.TRAINING:
        return NodeShare(
            name=node.name,
            pool=node.pool,
            jobs=[1],  # always full: there is always pending work
            last_checkpoint_at=_last_checkpoint(node, now, every),
        )
    return NodeShare(name=node.name, pool=node.pool, pods=int(node.pool == Pool.INFERENCE))


def replay_shared(
    trace: list[float],
    policy: SharePolicy,
    cluster: ClusterModel,
    times: MoveTimes,
    start_inference: int,
) -> Column:
    """The day under `decide`, starting from `start_inference` nodes serving."""
    every = cluster.ckpt_every_s
    gpus = cluster.gpus_per_node
    nodes = [
        _Node(
            name=f"gpu-{i:02d}",
            pool=Pool.INFERENCE if i < start_inference else Pool.TRAINING,
            # The day starts mid-run: each job's checkpoint phase differs.
            job_from=-every * i / cluster.nodes,
        )
        for i in range(cluster.nodes)
    ]
    by_name = {n.name: n for n in nodes}
    tally = _Tally(cluster, policy.inference.slo)
    col = Column(name="shared", min_training_nodes_seen=cluster.nodes)
    breach = calm = 0
    last_move_end: int | None = None
    moving: _Node | None = None
    redone = moving_gpu_s = 0.0
    eval_every = max(1, round(policy.evaluate_every_s))
    for now, rps in enumerate(trace):
        if moving is not None and now >= moving.move_end:
            assert moving.moving_to is not None
            moving.pool = Pool(moving.moving_to)
            moving.job_from = now + times.restart_s
            moving.moving_to, moving = None, None
        if moving is None and now > 0 and now % eval_every == 0:
            serving = sum(n.pool == Pool.INFERENCE for n in nodes)
            window = trace[max(0, now - cluster.window_s) : now]
            value = latency_p95(sum(window) / len(window), serving, cluster.capacity_rps)
            demand = Demand(
                at=float(now),
                inference_value=value,
                slo=policy.inference.slo,
                inference_rps=window[-1],
                ready_replicas=serving,
                nodes=[_share(n, now, every) for n in nodes],
            )
            since = None if last_move_end is None else float(now - last_move_end)
            verdict = decide(
                demand,
                policy,
                breach_streak=breach,
                calm_streak=calm,
                seconds_since_last_move=since,
            )
            breach, calm = verdict.breach_streak, verdict.calm_streak
            if verdict.to is not None and verdict.node is not None:
                moving = by_name[verdict.node]
                lost = 0.0
                if verdict.to == "inference":
                    lost = (now - _last_checkpoint(moving, now, every)) * gpus
                    redone += lost
                moving.pool, moving.moving_to = Pool.MOVING, verdict.to
                moving.move_end = now + times.duration(verdict.to)
                last_move_end = moving.move_end
                col.timeline.append(
                    MoveRecord(moving.name, verdict.to, now, moving.move_end, value, lost)
                )
        training = [n for n in nodes if n.pool == Pool.TRAINING]
        serving = sum(n.pool == Pool.INFERENCE for n in nodes)
        col.min_training_nodes_seen = min(col.min_training_nodes_seen, len(training))
        col.max_inference_nodes_seen = max(col.max_inference_nodes_seen, serving)
        restarting = sum(now < n.job_from for n in training)
        moving_gpu_s += (restarting + (moving is not None)) * gpus
        tally.second(rps, serving, (len(training) - restarting) * gpus)
    col.moves = len(col.timeline)
    return tally.fill(col, redone, moving_gpu_s)


@dataclass
class Comparison:
    shared: Column
    static: Column
    trace: TraceSpec
    cluster: ClusterModel
    times: MoveTimes
    policy: SharePolicy
    mean_rps: float
    max_rps: float

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": asdict(self.trace)
            | {"mean_rps_seen": self.mean_rps, "max_rps_seen": self.max_rps},
            "cluster": asdict(self.cluster),
            "move_times_modelled": asdict(self.times),
            "policy": self.policy.model_dump(exclude={"inference"})
            | {"slo": self.policy.inference.slo},
            "shared": self.shared.summary(),
            "static": self.static.summary(),
        }


def compare(
    spec: TraceSpec,
    policy: SharePolicy,
    cluster: ClusterModel,
    times: MoveTimes,
    static_inference: int,
) -> Comparison:
    """Both replays of one trace. The sharing workflow starts from the policy's minimum
    inference nodes; the static split keeps `static_inference` all day."""
    trace = make_trace(spec)
    return Comparison(
        shared=replay_shared(trace, policy, cluster, times, policy.min_inference_nodes),
        static=replay_static(trace, policy, cluster, static_inference),
        trace=spec,
        cluster=cluster,
        times=times,
        policy=policy,
        mean_rps=sum(trace) / len(trace),
        max_rps=max(trace),
    )


# --- the command ----------------------------------------------------------------------


def _rows(c: Comparison) -> list[tuple[str, str, str]]:
    r, s = c.shared, c.static

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    def gh(v: float) -> str:
        return f"{v:.2f}"

    return [
        (
            "SLO attainment, requests within SLO",
            pct(r.requests_within_slo),
            pct(s.requests_within_slo),
        ),
        (
            "SLO attainment, seconds with p95 within SLO",
            pct(r.time_within_slo),
            pct(s.time_within_slo),
        ),
        (
            "training GPU-hours done (net of redone)",
            gh(r.training_gpu_hours),
            gh(s.training_gpu_hours),
        ),
        ("GPU utilisation (useful)", pct(r.gpu_utilisation), pct(s.gpu_utilisation)),
        ("node moves", str(r.moves), str(s.moves)),
        ("work lost to moves, GPU-hours", gh(r.lost_gpu_hours), gh(s.lost_gpu_hours)),
        ("  redone since last checkpoint", gh(r.redone_gpu_hours), gh(s.redone_gpu_hours)),
        ("  nodes moving or restarting a job", gh(r.moving_gpu_hours), gh(s.moving_gpu_hours)),
        ("fewest training nodes", str(r.min_training_nodes_seen), str(s.min_training_nodes_seen)),
        (
            "most inference nodes serving",
            str(r.max_inference_nodes_seen),
            str(s.max_inference_nodes_seen),
        ),
    ]


def _params(c: Comparison) -> str:
    t, k, m, p = c.trace, c.cluster, c.times, c.policy
    return (
        f"trace: seed {t.seed}, a day in {t.day_s} s, {t.low_rps:g}-{t.peak_rps:g} rps diurnal, "
        f"{t.bursts} bursts up to x{t.burst_x:g} for {t.burst_s:g} s, noise {t.noise:g}; "
        f"mean {c.mean_rps:.1f} rps, max {c.max_rps:.1f} rps\n"
        f"cluster: {k.nodes} nodes x {k.gpus_per_node} GPUs, {k.capacity_rps:g} rps per "
        f"inference node (M/M/1 each), checkpoint every {k.ckpt_every_s:g} s\n"
        f"policy: SLO p95 {p.inference.slo:g} s, lend above x{p.lend_above:g}, return below "
        f"x{p.return_below:g}, sustain {p.sustain}, cooldown {p.cooldown_s:g} s, every "
        f"{p.evaluate_every_s:g} s, training >= {p.min_training_nodes}, inference "
        f"{p.min_inference_nodes}-{p.max_inference_nodes}\n"
        f"moves (modelled): drain {m.drain_s:g} s, handover {m.handover_s:g} s, health gate "
        f"{m.health_gate_s:g} s, job restart {m.restart_s:g} s"
    )


def print_table(c: Comparison) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GPU sharing vs a static split (modelled)")
    table.add_column("")
    table.add_column(c.shared.name, justify="right")
    table.add_column(c.static.name, justify="right")
    for row in _rows(c):
        table.add_row(*row)
    print(_params(c))
    Console(width=100).print(table)


def _args(argv: list[str] | None) -> argparse.Namespace:
    t, k, m = TraceSpec(), ClusterModel(), MoveTimes()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    a = ap.add_argument
    a("--seed", type=int, default=t.seed)
    a("--day-s", type=int, default=t.day_s, help="the day's curve compressed into this many s")
    a("--low-rps", type=float, default=t.low_rps)
    a("--peak-rps", type=float, default=t.peak_rps)
    a("--bursts", type=int, default=t.bursts)
    a("--burst-x", type=float, default=t.burst_x)
    a("--burst-s", type=float, default=t.burst_s)
    a("--noise", type=float, default=t.noise)
    a("--nodes", type=int, default=k.nodes)
    a("--gpus-per-node", type=int, default=k.gpus_per_node)
    a("--capacity-rps", type=float, default=k.capacity_rps, help="one inference node")
    a("--ckpt-every-s", type=float, default=k.ckpt_every_s)
    a("--window-s", type=int, default=k.window_s, help="the demand query's rate window")
    a("--static-inference", type=int, default=4, help="inference nodes of the static split")
    a("--drain-s", type=float, default=m.drain_s, help="modelled: drain, checkpoint, requeue")
    a("--handover-s", type=float, default=m.handover_s, help="modelled: Kubernetes handover")
    a("--health-gate-s", type=float, default=m.health_gate_s, help="modelled: gate + resume")
    a("--restart-s", type=float, default=m.restart_s, help="modelled: a job's restart")
    a("--slo", type=float, default=0.5, help="p95 latency SLO, seconds")
    a("--min-training", type=int, default=2)
    a("--min-inference", type=int, default=1)
    a("--max-inference", type=int, default=6)
    a("--lend-above", type=float, default=1.0)
    a("--return-below", type=float, default=0.5)
    a("--sustain", type=int, default=2)
    a("--cooldown-s", type=float, default=60)
    a("--evaluate-every-s", type=float, default=15)
    a("--json", action="store_true", help="one JSON line instead of the table")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if not 0 <= a.static_inference <= a.nodes:
        raise SystemExit("--static-inference must be between 0 and --nodes")
    policy = SharePolicy(
        inference=InferenceTarget(slo=a.slo),
        min_training_nodes=a.min_training,
        min_inference_nodes=a.min_inference,
        max_inference_nodes=a.max_inference,
        lend_above=a.lend_above,
        return_below=a.return_below,
        sustain=a.sustain,
        cooldown_s=a.cooldown_s,
        evaluate_every_s=a.evaluate_every_s,
    )
    spec = TraceSpec(
        seed=a.seed,
        day_s=a.day_s,
        low_rps=a.low_rps,
        peak_rps=a.peak_rps,
        bursts=a.bursts,
        burst_x=a.burst_x,
        burst_s=a.burst_s,
        noise=a.noise,
        noise_every_s=max(1, round(a.evaluate_every_s)),
    )
    cluster = ClusterModel(a.nodes, a.gpus_per_node, a.capacity_rps, a.ckpt_every_s, a.window_s)
    times = MoveTimes(a.drain_s, a.handover_s, a.health_gate_s, a.restart_s)
    result = compare(spec, policy, cluster, times, a.static_inference)
    if a.json:
        print(json.dumps(result.to_json()))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
