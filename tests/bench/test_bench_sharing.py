"""bench/sharing.py: the latency model, and the sharing workflow's replay against a static split on
small traces (properties of the timeline, not figures)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from autoclusters.core.sharing import InferenceTarget, SharePolicy


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "sharing.py"
    spec = importlib.util.spec_from_file_location("bench_sharing", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sharing = _load()

POLICY = SharePolicy(
    inference=InferenceTarget(slo=0.5),
    min_training_nodes=2,
    min_inference_nodes=1,
    max_inference_nodes=5,
    return_below=0.5,
    sustain=2,
    cooldown_s=60,
    evaluate_every_s=15,
)
CLUSTER = sharing.ClusterModel(nodes=6, gpus_per_node=8, capacity_rps=20.0, ckpt_every_s=60.0)
# A short, bursty day: the peak and its bursts need 4-5 nodes, one serves the night.
BURSTY = sharing.TraceSpec(
    seed=3, day_s=1800, low_rps=5, peak_rps=60, bursts=4, burst_x=1.8, burst_s=120
)


def test_p95_is_the_mm1_formula_per_node() -> None:
    # One node: M/M/1, p95 of Exp(μ - λ) is ln(20)/(μ - λ).
    assert sharing.latency_p95(10.0, 1, 20.0) == pytest.approx(math.log(20) / 10.0)
    # Spread over more nodes the same load waits less.
    assert sharing.latency_p95(30.0, 2, 20.0) == pytest.approx(math.log(20) / 5.0)
    assert sharing.latency_p95(30.0, 3, 20.0) < sharing.latency_p95(30.0, 2, 20.0)
    # At the p95, 95 % of requests are within it.
    p95 = sharing.latency_p95(25.0, 2, 20.0)
    assert sharing.within_slo(25.0, 2, 20.0, p95) == pytest.approx(0.95)
    # Saturated or empty: the cap, and no request within any SLO.
    assert sharing.latency_p95(40.0, 2, 20.0) == sharing.LATENCY_CAP_S
    assert sharing.latency_p95(5.0, 0, 20.0) == sharing.LATENCY_CAP_S
    assert sharing.within_slo(40.0, 2, 20.0, 10.0) == 0.0


def test_trace_is_deterministic_from_its_seed_and_diurnal() -> None:
    a, b = sharing.make_trace(BURSTY), sharing.make_trace(BURSTY)
    assert a == b
    assert sharing.make_trace(sharing.TraceSpec(**{**BURSTY.__dict__, "seed": 4})) != a
    night = sum(a[: BURSTY.day_s // 12]) / (BURSTY.day_s // 12)  # 00:00-02:00
    afternoon = a[BURSTY.day_s * 13 // 24 : BURSTY.day_s * 15 // 24]  # 13:00-15:00
    assert night < 2 * BURSTY.low_rps < min(afternoon)


def test_sharing_beats_an_underprovisioned_static_split() -> None:
    result = sharing.compare(BURSTY, POLICY, CLUSTER, sharing.MoveTimes(), static_inference=2)
    shared, static = result.shared, result.static

    assert shared.requests_within_slo >= static.requests_within_slo + 0.2
    assert shared.time_within_slo > static.time_within_slo
    assert shared.moves > 0
    assert {m.to for m in shared.timeline} == {"inference", "training"}
    assert static.moves == 0 and static.lost_gpu_hours == 0 and static.timeline == []
    # The static split trains on its 4 nodes all day, exactly.
    assert static.training_gpu_hours == pytest.approx(4 * 8 * BURSTY.day_s / 3600)
    assert shared.lost_gpu_hours > 0


def test_shared_timeline_keeps_the_policy() -> None:
    col = sharing.compare(BURSTY, POLICY, CLUSTER, sharing.MoveTimes(), 2).shared
    assert col.min_training_nodes_seen >= POLICY.min_training_nodes
    assert col.max_inference_nodes_seen <= POLICY.max_inference_nodes
    moves = col.timeline
    for before, after in zip(moves, moves[1:], strict=False):
        # One move at a time, and none within the cooldown of the last one's end.
        assert after.start - before.end >= POLICY.cooldown_s
    slo = POLICY.inference.slo
    for move in moves:
        # Each move had the figure that justifies it.
        if move.to == "inference":
            assert move.demand > slo * POLICY.lend_above
        else:
            assert move.demand < slo * POLICY.return_below


def test_noisy_flat_demand_in_the_band_moves_nothing() -> None:
    # Around 35 rps on 3 nodes the p95 (~0.36 s; 0.30-0.45 s within 3 sigma of the noise)
    # sits between return (0.25 s) and lend (0.5 s): a sharing workflow at 3 nodes holds.
    flat = sharing.TraceSpec(seed=1, day_s=1200, low_rps=35, peak_rps=35, bursts=0, noise=0.05)
    trace = sharing.make_trace(flat)
    assert max(trace) > 1.05 * min(trace)  # the noise is there
    col = sharing.replay_shared(trace, POLICY, CLUSTER, sharing.MoveTimes(), 3)
    assert col.moves == 0
    assert col.lost_gpu_hours == 0


def test_json_line_has_both_columns(capsys: pytest.CaptureFixture[str]) -> None:
    assert sharing.main(["--day-s", "900", "--bursts", "2", "--json"]) == 0
    line = capsys.readouterr().out.strip()
    assert "\n" not in line
    out = json.loads(line)
    assert out["static"]["moves"] == 0
    assert out["trace"]["day_s"] == 900
    for column in ("shared", "static"):
        assert 0 <= out[column]["requests_within_slo"] <= 1
        assert 0 <= out[column]["gpu_utilisation"] <= 1
