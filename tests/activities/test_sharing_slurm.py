"""The Slurm steps of a GPU-sharing move (activities/sharing_slurm.py) and the demand reading
(activities/sharing_demand.py), against the in-memory Slurm of tests/fakes/systems.py and a local
HTTP server standing in for Prometheus's query API.

- a node is drained for a move only when it is ours to move (never over an admin's or an
  incident's drain); a lent node is marked lent only once idle;
- a job is asked to checkpoint once per move even when the step is retried; a job that
  ignores the signal is requeued after the grace, once; requeue holds are released;
- resume only undoes our own drain; regrow requeues only jobs narrower than they asked;
- pools, incidents and spares are read from drain reasons; Prometheus's answers (vector,
  scalar, NaN, no data, down) become a figure or None.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.sharing_demand import (
    ShareDemandActivities,
    in_incident,
    node_gpus,
    pool_from_slurm,
    prometheus_value,
)
from autoclusters.activities.sharing_slurm import ShareSlurmActivities
from autoclusters.core.models import SPARE_REASON, SlurmNode, drain_reason
from autoclusters.core.sharing import (
    LENT_REASON,
    DemandCall,
    MoveCall,
    Pool,
    SharePolicy,
    move_reason,
)
from autoclusters.integrations.prometheus import PrometheusUnavailable
from tests.fakes.systems import FakeSlurm


def call(node: str = "gpu-1", move: str = "c-move-1", grace: float = 0.3) -> MoveCall:
    return MoveCall(
        cluster="c", node=node, move_id=move, policy=SharePolicy(checkpoint_grace_s=grace)
    )


def run(coro: Any) -> Any:
    return asyncio.run(ActivityEnvironment().run(lambda: coro))


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        s.add_node(n)
    return s


def acts(slurm: FakeSlurm) -> ShareSlurmActivities:
    return ShareSlurmActivities(slurm, poll_s=0.01)


def test_drain_refuses_a_node_someone_else_drained(slurm: FakeSlurm) -> None:
    slurm.set_reason("gpu-1", "admin: bad DIMM")
    with pytest.raises(ApplicationError) as e:
        run(acts(slurm).drain_for_move(call()))
    assert e.value.type == "NodeNotOurs" and e.value.non_retryable
    assert slurm.node_now("gpu-1").reason == "admin: bad DIMM"
    slurm.set_reason("gpu-2", drain_reason("inc-1", "XID_79"))
    with pytest.raises(ApplicationError):
        run(acts(slurm).drain_for_move(call("gpu-2")))
    assert slurm.node_now("gpu-2").reason == drain_reason("inc-1", "XID_79")


def test_drain_is_idempotent_under_the_moves_reason(slurm: FakeSlurm) -> None:
    first = run(acts(slurm).drain_for_move(call()))
    again = run(acts(slurm).drain_for_move(call()))
    assert first.changed and not again.changed
    assert slurm.node_now("gpu-1").reason == move_reason("c-move-1")
    assert slurm.calls["drain"] == 1


def test_a_checkpointing_job_is_signalled_once_even_when_the_step_is_retried(
    slurm: FakeSlurm,
) -> None:
    slurm.add_job(7, nodes="gpu-[1-2]")
    slurm.checkpointing.add(7)
    run(acts(slurm).drain_for_move(call()))
    out = run(acts(slurm).checkpoint_jobs(call()))
    assert out.signalled == [7] and out.requeued == [] and out.holds_released == [7]
    # A retry after the side effect (the worker died before reporting): no second signal.
    again = run(acts(slurm).checkpoint_jobs(call()))
    assert slurm.signals[7] == 1 and slurm.requeue_count[7] == 0
    assert again.requeued == []
    assert slurm.job_now(7).restart_cnt == 1


def test_a_job_that_ignores_the_signal_is_requeued_after_the_grace_once(slurm: FakeSlurm) -> None:
    slurm.add_job(8, nodes="gpu-1")
    run(acts(slurm).drain_for_move(call()))
    out = run(acts(slurm).checkpoint_jobs(call(grace=0.05)))
    assert out.signalled == [8] and out.requeued == [8]
    assert slurm.requeue_count[8] == 1 and slurm.signals[8] == 1
    assert not [j for j in run(slurm.jobs_on_node("gpu-1")) if j.job_state == "RUNNING"]


def test_mark_lent_needs_an_idle_node_drained_by_the_move(slurm: FakeSlurm) -> None:
    slurm.add_job(9, nodes="gpu-1")
    run(acts(slurm).drain_for_move(call()))
    with pytest.raises(ApplicationError) as e:
        run(acts(slurm).mark_lent(call()))
    assert e.value.type == "NotIdle"  # retryable: the job may still be on its way out
    slurm.finish_job(9)
    assert run(acts(slurm).mark_lent(call())).changed
    assert slurm.node_now("gpu-1").reason == LENT_REASON


def test_resume_only_undoes_the_sharing_drain(slurm: FakeSlurm) -> None:
    slurm.set_reason("gpu-1", LENT_REASON)
    assert run(acts(slurm).resume_training(call())).changed
    assert not slurm.node_now("gpu-1").drained
    slurm.set_reason("gpu-2", drain_reason("inc-2", "XID_48"))
    with pytest.raises(ApplicationError):
        run(acts(slurm).resume_training(call("gpu-2")))
    assert slurm.node_now("gpu-2").drained


def test_regrow_requeues_only_jobs_still_narrower_than_before_once(slurm: FakeSlurm) -> None:
    slurm.add_job(10, nodes="gpu-[1-2]")  # ran 3 wide before the lend: regrown
    slurm.add_job(11, nodes="gpu-3")  # ran 1 wide: already full
    slurm.checkpointing.update({10, 11})
    back = call().model_copy(update={"regrow": {10: 3, 11: 1, 12: 2}})  # 12 has ended
    out = run(acts(slurm).regrow_jobs(back))
    assert out.requeued == [10] and sorted(out.settled) == [11, 12]
    assert slurm.signals == {10: 1}
    assert slurm.job_now(10).job_state == "PENDING"  # requeued itself, hold released
    assert slurm.release_count[10] == 1


def test_regrow_names_a_job_not_started_again_and_leaves_it_be(slurm: FakeSlurm) -> None:
    slurm.add_job(10, nodes="", job_state="PENDING")  # requeued by the lend, not running yet
    back = call().model_copy(update={"regrow": {10: 3}})
    out = run(acts(slurm).regrow_jobs(back))
    assert out.pending == [10] and out.requeued == [] and out.settled == []
    assert slurm.signals == {}


def test_a_job_still_completing_its_requeue_has_its_hold_released_once_pending(
    slurm: FakeSlurm,
) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]")
    slurm.checkpointing.add(7)
    slurm.completing_reads[7] = 3  # its other nodes take a moment to finish the old run
    run(acts(slurm).drain_for_move(call()))
    out = run(acts(slurm).checkpoint_jobs(call()))
    assert out.holds_released == [7] and slurm.release_count[7] == 1


def test_checkpoint_records_each_jobs_width_even_across_a_retry(slurm: FakeSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]")
    slurm.checkpointing.add(7)
    run(acts(slurm).drain_for_move(call()))
    assert run(acts(slurm).checkpoint_jobs(call())).widths == {7: 3}
    # The job has left (requeued itself); a retry still knows how wide it was.
    assert run(acts(slurm).checkpoint_jobs(call())).widths == {7: 3}


def test_pools_and_incidents_are_read_from_drain_reasons() -> None:
    def node(reason: str = "", flags: tuple[str, ...] = ("DRAIN",)) -> SlurmNode:
        return SlurmNode(name="n", state="idle", state_flags=list(flags), reason=reason)

    assert pool_from_slurm(node(LENT_REASON)) == Pool.INFERENCE
    assert pool_from_slurm(node(move_reason("m-1"))) == Pool.MOVING
    assert pool_from_slurm(node(flags=())) == Pool.TRAINING
    assert in_incident(node(drain_reason("inc-1", "XID_79")))
    assert not in_incident(node(LENT_REASON)) and not in_incident(node(SPARE_REASON))
    assert in_incident(node(flags=("NOT_RESPONDING",)))
    assert node_gpus(SlurmNode(name="n", state="idle", gres="gpu:h100:8(S:0-1)")) == 8
    assert node_gpus(SlurmNode(name="n", state="idle", gres="")) == 0


class _Prometheus(BaseHTTPRequestHandler):
    answers: dict[str, Any] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        query = parse_qs(urlsplit(self.path).query)["query"][0]
        body = self.answers.get(query)
        if body is None:
            self.send_response(400)
            self.end_headers()
            return
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _vector(v: str) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, v]}]},
    }  # noqa: E501


def test_prometheus_answers_become_a_figure_or_none(prometheus: str) -> None:
    _Prometheus.answers = {
        "v": _vector("0.75"),
        "nan": _vector("NaN"),
        "empty": {"status": "success", "data": {"resultType": "vector", "result": []}},
        "s": {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}},
    }

    async def go() -> list[float | None]:
        async with httpx.AsyncClient() as http:
            return [await prometheus_value(http, prometheus, q) for q in ("v", "nan", "empty", "s")]

    assert asyncio.run(go()) == [0.75, None, None, 2.0]


@pytest.mark.parametrize("where", ["refused query", "closed port"])
def test_a_prometheus_that_does_not_answer_is_unavailable_not_no_figure(
    prometheus: str, where: str
) -> None:
    _Prometheus.answers = {}
    url = prometheus if where == "refused query" else "http://127.0.0.1:9"

    async def go() -> float | None:
        async with httpx.AsyncClient() as http:
            return await prometheus_value(http, url, "v")

    with pytest.raises(PrometheusUnavailable):
        asyncio.run(go())


def test_demand_lists_gpu_nodes_with_their_pool_jobs_and_incidents(
    slurm: FakeSlurm, prometheus: str
) -> None:
    policy = SharePolicy()
    _Prometheus.answers = {
        policy.inference.demand_query: _vector("0.9"),
        policy.inference.rate_query: _vector("42"),
    }
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        slurm._nodes[n].gres = "gpu:8"  # noqa: SLF001
    slurm.add_node("gpu-4")
    slurm._nodes["gpu-4"].gres = "gpu:8"  # noqa: SLF001
    slurm.add_node("cpu-1")  # no GPUs: never shared
    slurm.set_reason("gpu-2", LENT_REASON)
    slurm.set_reason("gpu-3", drain_reason("inc-3", "XID_79"))
    slurm.set_reason("gpu-4", SPARE_REASON)
    slurm.add_job(5, nodes="gpu-1")

    async def go() -> Any:
        async with httpx.AsyncClient() as http:
            demand = ShareDemandActivities(slurm, http, prometheus_url=prometheus)
            return await ActivityEnvironment().run(
                demand.read_demand, DemandCall(cluster="c", policy=policy)
            )

    d = asyncio.run(go())
    assert d.inference_value == 0.9 and d.inference_rps == 42
    by = {n.name: n for n in d.nodes}
    assert set(by) == {"gpu-1", "gpu-2", "gpu-3"}  # the spare and the CPU node are not shared
    assert by["gpu-1"].pool == Pool.TRAINING and by["gpu-1"].jobs == [5]
    assert by["gpu-2"].pool == Pool.INFERENCE
    assert by["gpu-3"].in_incident and not by["gpu-1"].in_incident
    assert d.training_running_gpus == 8
