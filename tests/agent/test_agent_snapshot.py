"""The agent's health snapshot: the model, what a check puts in it, when it is sent.

- the model: ids derived from content, unknown fields ignored, bad fields refused;
- a check of a healthy fake node: its GPU count, no fault, every InfiniBand port healthy,
  the fake file's boot id (else the machine's);
- sent at start, then every snapshot interval, and at once when what is seen changes;
  a refused send is tried again at the next check;
- what the hardware shows now: an Xid latched from long ago is not active; after a reboot
  that did not fix it (`fake_backend.boot`) the Xid shows again, from a new boot;
- HttpSender posts it to /v1/health-snapshots with the bearer token.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from autoclusters.clients.agent import fake_backend
from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.fake_backend import FakeBackend, FakeInfiniband
from autoclusters.clients.agent.reporter import Answer, HttpSender, Outcome
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.node_report import SNAPSHOTS_PATH, HealthSnapshot
from tests.fakes.systems import ReportSink


class Snapshots:
    def __init__(self) -> None:
        self.sent: list[HealthSnapshot] = []
        self.refuse = False

    def send_snapshot(self, snapshot: HealthSnapshot) -> Answer:
        if self.refuse:
            return Answer(Outcome.RETRY, "HTTP 503")
        self.sent.append(snapshot)
        return Answer(Outcome.SENT, "HTTP 202")


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        return self.now


def _agent(path: Path, snapshots: Snapshots, clock: Clock) -> Agent:
    backend = FakeBackend(path)
    backend.open()
    settings = AgentSettings(expected_gpus=8, snapshot_interval_s=10, event_latch_s=60)
    return Agent(
        node="gpu-01", settings=settings, backend=backend, infiniband=FakeInfiniband(path),
        sink=ReportSink(), clock=clock, snapshots=snapshots,
    )  # fmt: skip


def test_the_model_derives_its_id_and_names_bad_fields() -> None:
    at = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    a = HealthSnapshot.build(node="gpu-01", observed_at=at, boot_id="b1", gpu_count=8)
    assert (
        a.snapshot_id
        == HealthSnapshot.build(node="gpu-01", observed_at=at, boot_id="b1").snapshot_id
    )
    assert (
        a.snapshot_id
        != HealthSnapshot.build(node="gpu-01", observed_at=at, boot_id="b2").snapshot_id
    )
    doc = a.model_dump(mode="json") | {"from_a_newer_agent": 1}
    assert HealthSnapshot.model_validate(doc) == a
    with pytest.raises(ValidationError) as bad:
        HealthSnapshot.model_validate(a.model_dump(mode="json") | {"gpu_count": -1})
    assert [e["loc"] for e in bad.value.errors()] == [("gpu_count",)]
    with pytest.raises(ValidationError):
        HealthSnapshot.model_validate(a.model_dump(mode="json") | {"node": "gpu 01"})


def test_a_healthy_node_is_sent_at_start_then_every_interval(tmp_path: Path) -> None:
    path, snaps, clock = tmp_path / "gpu-01.json", Snapshots(), Clock()
    agent = _agent(path, snaps, clock)
    first = agent.check().snapshot
    assert first is not None and snaps.sent == [first]
    assert (first.node, first.gpu_count, first.expected_gpus, first.backend) == (
        "gpu-01", 8, 8, "fake",
    )  # fmt: skip
    assert first.faults == [] and first.firing == []
    assert first.infiniband is not None and len(first.infiniband) == 8
    assert all(p.healthy for p in first.infiniband)
    assert first.boot_id  # the machine's own, the fake file carrying none
    clock.now += 5
    agent.check()
    assert len(snaps.sent) == 1  # nothing changed within the interval
    clock.now += 5
    agent.check()
    assert len(snaps.sent) == 2


def test_a_change_is_sent_at_once_and_a_refused_send_is_retried(tmp_path: Path) -> None:
    path, snaps, clock = tmp_path / "gpu-01.json", Snapshots(), Clock()
    agent = _agent(path, snaps, clock)
    agent.check()
    fake_backend.inject(path, fault="IB_LINK_DOWN", hca="mlx5_3")
    snaps.refuse = True
    clock.now += 1
    agent.check()
    assert len(snaps.sent) == 1
    snaps.refuse = False
    clock.now += 1
    agent.check()
    assert len(snaps.sent) == 2
    down = [p for p in snaps.sent[-1].infiniband or [] if not p.healthy]
    assert [(p.hca, p.state) for p in down] == [("mlx5_3", "1: DOWN")]


def test_an_xid_that_a_reboot_did_not_fix_shows_again_from_a_new_boot(tmp_path: Path) -> None:
    path, snaps, clock = tmp_path / "gpu-01.json", Snapshots(), Clock()
    fake_backend.write_node(path, fake_backend.healthy_node())
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    fake_backend.inject(path, fault="XID_79", now=long_ago)
    agent = _agent(path, snaps, clock)
    before = agent.check().snapshot
    assert before is not None and before.faults == []  # latched long ago: nothing now

    fake_backend.boot(path, healthy=False, still_broken=["XID_79"])
    clock.now += 1
    after = agent.check().snapshot
    assert after is not None and after.boot_id != before.boot_id
    assert [f.fault for f in after.faults] == ["XID_79"]
    assert after.faults[0].last_at > long_ago + timedelta(minutes=59)
    assert "XID_79" in after.firing
    assert snaps.sent[-1] == after

    fake_backend.boot(path, healthy=True)  # a replacement: a new, healthy machine
    clock.now += 61  # past the latch of the Xid raised at the last boot
    healthy = agent.check().snapshot
    assert healthy is not None and healthy.boot_id not in (before.boot_id, after.boot_id)
    assert healthy.faults == [] and healthy.gpu_count == 8


def test_http_sender_posts_snapshots_with_the_token() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"forwarded": False})

    client = httpx.Client(
        transport=httpx.MockTransport(answer), headers={"Authorization": "Bearer t0k"}
    )
    sender = HttpSender(api="http://api.test/", token="t0k", client=client)
    snap = HealthSnapshot.build(node="gpu-01", observed_at=datetime.now(UTC), gpu_count=8)
    assert sender.send_snapshot(snap).outcome is Outcome.SENT
    (req,) = seen
    assert req.url.path == SNAPSHOTS_PATH and req.headers["authorization"] == "Bearer t0k"
    assert HealthSnapshot.model_validate(json.loads(req.content)) == snap
