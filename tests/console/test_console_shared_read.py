"""The console's one shared read of the cluster (clients/console/shared_read.py) and the
topology page at fleet scale, over HTTP:

- a slow read never holds a page: while a read hangs, every request is answered at once
  with the last value, its age grows and, past max_age_s, it says it is stale; a read
  slower than the bound is abandoned and the next one brings the data back;
- under load the age stays bounded and the cost stays one read per interval: 50 viewers
  polling at once for a while cost about elapsed / fresh_s reads, every answer's data is at
  most fresh_s plus a read old, and a change in the cluster reaches them within that;
- nobody looking, no reads: the loop stops and forgets its value;
- the topology of 2,000 nodes: every node once, dense, a poll under 200 KB (7 KB
  gzipped), the `Age` and `ETag` headers, 304 for a poll that has the data already, and
  the page says how old its data is.

(An earlier shared read, reverted in 619291d, made requests wait for the read in flight:
pages went stale under load. These tests are what it lacked.)
"""

from __future__ import annotations

import asyncio
import gzip
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio

from autoclusters.clients.console.cluster_read import read_cluster
from autoclusters.clients.console.routes import Console
from autoclusters.clients.console.shared_read import ReadUnavailable, SharedRead
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.server import create_server
from autoclusters.core.policy import Policy
from tests.console.test_console import TOKEN, no_temporal, settings
from tests.fakes.fleet import FleetSource
from tests.helpers import eventually

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Gate:
    """A read whose answers the test lets through one by one (or holds)."""

    def __init__(self) -> None:
        self.value = 0
        self.open = asyncio.Event()
        self.open.set()
        self.started = 0
        self.starts: list[float] = []  # when each read began (time.monotonic)

    async def read(self) -> int:
        self.started += 1
        self.starts.append(time.monotonic())
        await self.open.wait()
        return self.value


def shared(gate: Gate, **kw: float) -> SharedRead[int]:
    args = {"fresh_s": 0.05, "max_age_s": 0.4, "timeout_s": 0.4, "idle_s": 5.0, **kw}
    return SharedRead(gate.read, **args)


async def test_a_slow_read_never_holds_a_page_and_its_age_is_said() -> None:
    gate = Gate()
    s = shared(gate, timeout_s=30)  # the read may hang: nothing abandons it here
    try:
        first = await s.get()
        assert first.value == 0 and not first.stale
        gate.open.clear()  # the next read hangs
        gate.value = 1
        await eventually(lambda: _true(gate.started >= 2), 5, "a second read starts")
        ages = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            asked = time.monotonic()
            snap = await s.get()
            assert time.monotonic() - asked < 0.5, "a request waited for the read (it hangs)"
            assert snap.value == 0  # the last value, not nothing
            ages.append(snap.age_s)
            await asyncio.sleep(0.02)
        assert ages == sorted(ages) and ages[-1] > 0.9  # it ages, and says so
        assert (await s.get()).stale  # past max_age_s (0.4 s)
        gate.open.set()  # the read answers: fresh again
        fresh = await eventually(lambda: _fresh(s, 1), 5, "the new value")
        assert fresh.age_s < 0.4 and not fresh.stale
    finally:
        await s.aclose()


async def test_a_read_slower_than_the_bound_is_abandoned_and_the_next_brings_data_back() -> None:
    gate = Gate()
    s = shared(gate, timeout_s=0.3, max_age_s=0.3)
    try:
        assert (await s.get()).value == 0
        gate.open.clear()
        gate.value = 7
        stale = await eventually(lambda: _stale(s), 5, "the answer to say it is stale")
        assert stale.value == 0 and "longer than 0.3 s" in stale.last_error
        reads = gate.started
        await eventually(
            lambda: _true(gate.started > reads), 5, "the hung read abandoned, another started"
        )
        gate.open.set()
        back = await eventually(lambda: _fresh(s, 7), 5, "the data back")
        assert back.last_error == "" and not back.stale
    finally:
        await s.aclose()


async def test_nobody_looking_no_reads_and_no_old_value() -> None:
    gate = Gate()
    s = shared(gate, idle_s=0.2)
    try:
        await s.get()
        await eventually(lambda: _true(s.latest() is None), 5, "the loop to stop and forget")
        reads = gate.started
        await asyncio.sleep(0.3)
        assert gate.started == reads  # nothing read while nobody looks
        gate.value = 3
        assert (await s.get()).value == 3  # the next viewer waits for a fresh read
    finally:
        await s.aclose()


async def test_a_loop_started_again_never_reads_sooner_than_fresh_s() -> None:
    """The interval holds across the loops: stopped and asked again at once, five times,
    the shared read began each read at least fresh_s after the one before (ci21 counted
    47 reads in 2.3 s for a 0.25 s interval)."""
    gate = Gate()
    fresh_s = 0.3
    s = shared(gate, fresh_s=fresh_s, max_age_s=1.0, timeout_s=1.0)
    try:
        await s.get()
        for _ in range(5):
            await s.aclose()
            await s.get()
    finally:
        await s.aclose()
    gaps = [b - a for a, b in zip(gate.starts, gate.starts[1:], strict=False)]
    assert len(gaps) == 5 and min(gaps) >= fresh_s - 0.05, gaps


async def test_the_first_viewer_waits_a_bounded_time_then_hears_why() -> None:
    gate = Gate()
    gate.open.clear()
    s = shared(gate, timeout_s=0.2)
    try:
        asked = time.monotonic()
        with pytest.raises(ReadUnavailable):
            await s.get()
        assert time.monotonic() - asked < 1.0
    finally:
        await s.aclose()


def test_fresh_s_must_be_within_the_age_bound() -> None:
    with pytest.raises(ValueError, match="fresh_s"):
        SharedRead(Gate().read, fresh_s=5, max_age_s=1, timeout_s=1, idle_s=1)


async def _true(value: bool) -> bool:
    return value


async def _fresh(s: SharedRead[int], want: int) -> Any:
    snap = await s.get()
    return snap if snap.value == want and not snap.stale else None


async def _stale(s: SharedRead[int]) -> Any:
    snap = await s.get()
    return snap if snap.stale else None


# --- the console at fleet scale, over HTTP -------------------------------------------------


def fleet_app(nodes: int, **console: float) -> tuple[Any, FleetSource]:
    s = settings(api_nodes=[f"gpu-[0001-{nodes:04d}]"])
    app = create_server(s, client_factory=no_temporal, inventory=StaticInventory(s.api_nodes))
    c: Console = app.state.console
    source = FleetSource(nodes, read_s=console.pop("read_s", 0.0))
    c.source = source
    if console:
        c.shared.fresh_s = console.get("fresh_s", c.shared.fresh_s)
        c.shared.max_age_s = console.get("max_age_s", c.shared.max_age_s)
        c.shared.timeout_s = c.shared.max_age_s
    return app, source


@pytest_asyncio.fixture
async def fleet() -> AsyncIterator[tuple[httpx.AsyncClient, FleetSource]]:
    app, source = fleet_app(2000)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://c.test", headers=AUTH) as c:
        yield c, source
    await app.state.console.shared.aclose()


async def test_under_load_the_age_stays_bounded_and_one_read_serves_every_viewer() -> None:
    fresh_s, read_s = 0.25, 0.05
    app, source = fleet_app(200, fresh_s=fresh_s, read_s=read_s)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    ages: list[float] = []
    seen: dict[int, float] = {}  # viewer -> when it first saw the new incident
    async with httpx.AsyncClient(transport=transport, base_url="http://c.test", headers=AUTH) as c:
        await c.get("/ui/api/topology")  # the first read
        reads0, start = source.reads, time.monotonic()
        changed_at: list[float] = []

        async def viewer(i: int) -> None:
            # Two seconds of polls, then on until this viewer has seen the change: on a
            # loaded machine the change's own wake-up can come late in the two seconds
            # (30 s only guards against a hang).
            while time.monotonic() - start < 2.0 or (
                i not in seen and time.monotonic() - start < 30.0
            ):
                r = await c.get("/ui/api/topology")
                got = time.time()
                body = r.json()
                ages.append(got - datetime.fromisoformat(body["updated_at"]).timestamp())
                if changed_at and i not in seen and _state(body, "gpu-0100") == "quarantined":
                    seen[i] = time.monotonic()
                await asyncio.sleep(0.2 + 0.02 * (i % 5))  # 50 viewers: ~200 polls a second

        async def change() -> None:
            await asyncio.sleep(0.8)
            source.add_incident("gpu-0100", "XID_79")
            changed_at.append(time.monotonic())

        await asyncio.gather(change(), *(viewer(i) for i in range(50)))
        elapsed = time.monotonic() - start
    await app.state.console.shared.aclose()
    # One read per interval, however many ask (a read starts fresh_s after the last began),
    # and the reads keep coming under the load (the ages below say the data does not age
    # with it; how many reads a loaded machine fits in the 2 s is not this test's to say).
    reads = source.reads - reads0
    assert 2 <= reads <= elapsed / fresh_s + 2, (reads, elapsed)
    # Every answer's data at most fresh_s plus a read old, give or take what a loaded
    # 2-core CI machine adds (these viewers share the API's process and its CPU).
    ages.sort()
    assert ages[len(ages) // 2] <= fresh_s + read_s + 0.25, (ages[len(ages) // 2], ages[-1])
    slack = 1.0
    assert ages[-1] <= fresh_s + read_s + slack, ages[-1]
    assert len(seen) == 50, "every viewer saw the change"
    assert max(seen.values()) - changed_at[0] <= fresh_s + read_s + slack


def _state(body: dict[str, Any], node: str) -> str | None:
    for p in body["pods"]:
        for lf in p["leaves"]:
            for g in lf["groups"]:
                for t in g["tiles"]:
                    if t["node"] == node:
                        state: str = t["state"]
                        return state
    return None


async def test_two_thousand_nodes_poll_under_200_kb_dense_and_each_node_once(
    fleet: tuple[httpx.AsyncClient, FleetSource],
) -> None:
    c, source = fleet
    r = await c.get("/ui/api/topology", headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200 and "content-encoding" not in r.headers
    assert len(r.content) <= 200_000, len(r.content)
    body = r.json()
    names = [t["node"] for p in body["pods"] for lf in p["leaves"] for g in lf["groups"]
             for t in g["tiles"]]  # fmt: skip
    assert sorted(names) == source.names
    assert body["dense"] is True and sum(body["counts"].values()) == 2000
    assert body["node_sets"] == ["inference", "spares", "training"]
    assert set(body["faults"]) == {i.request.fault for i in source.open.values()}
    tiles = [
        t for p in body["pods"] for lf in p["leaves"] for g in lf["groups"] for t in g["tiles"]
    ]
    assert {t["node"] for t in tiles if t.get("incident_id")} == set(source.open)
    assert "label" not in tiles[0] and "fault" not in tiles[0]  # compact: empty fields left out
    assert body["labels"]["waiting_approval"] == "waiting for approval"
    # gzipped for a browser; the same JSON.
    z = await c.get("/ui/api/topology", headers={"Accept-Encoding": "gzip"})
    assert z.headers["content-encoding"] == "gzip" and z.num_bytes_downloaded < 20_000
    assert z.json() == body


async def test_a_poll_says_its_age_and_a_poll_with_the_data_already_gets_304(
    fleet: tuple[httpx.AsyncClient, FleetSource],
) -> None:
    c, source = fleet
    r = await c.get("/ui/api/topology")
    assert int(r.headers["age"]) >= 0 and r.json()["stale_after_s"] == 10.0
    etag = r.headers["etag"]
    again = await c.get("/ui/api/topology", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and "age" in again.headers
    source.add_incident("gpu-0005", "XID_79")  # the cluster changes: a new ETag, a body

    async def new_body() -> httpx.Response | None:
        got = await c.get("/ui/api/topology", headers={"If-None-Match": etag})
        return got if got.status_code == 200 else None

    changed = await eventually(new_body, 10, "the next read's new data")
    assert changed.headers["etag"] != etag and _state(changed.json(), "gpu-0005") == "quarantined"
    page = await c.get("/ui/topology")
    assert 'id="data-age"' in page.text and " s old</span>" in page.text


async def test_the_topology_page_of_two_thousand_nodes_is_one_small_cell_each(
    fleet: tuple[httpx.AsyncClient, FleetSource],
) -> None:
    c, source = fleet
    page = await c.get("/ui/topology", headers={"Accept-Encoding": "gzip"})
    assert page.headers["content-encoding"] == "gzip"
    assert page.num_bytes_downloaded < 100_000
    html = page.text
    assert 'class="topology dense"' in html
    assert html.count('<a class="tile ') == 2000
    assert '<span class="name">' not in html  # no text tiles at this scale
    node = next(iter(source.open))
    assert f'data-node="{node}" data-state="' in html
    for control in ('id="search"', 'id="filter-fault"', 'id="filter-set"', 'data-state="failed"'):
        assert control in html
    raw = await c.get("/ui/topology", headers={"Accept-Encoding": "identity"})
    assert gzip.compress(raw.content)  # the same page, unzipped, for a client that asks so
    assert raw.text.count('<a class="tile ') == 2000


async def test_slurm_failing_keeps_the_nodes_of_the_last_read_and_says_so(
    fleet: tuple[httpx.AsyncClient, FleetSource],
) -> None:
    c, source = fleet
    await c.get("/ui/api/topology")

    async def down() -> list[Any]:
        raise RuntimeError("slurmctld not responding")

    source.slurm_nodes = down  # type: ignore[method-assign]

    async def failed_read() -> dict[str, Any] | None:
        body: dict[str, Any] = (await c.get("/ui/api/topology")).json()
        return body if any("slurmctld" in e for e in body["errors"]) else None

    body = await eventually(failed_read, 10, "a read without Slurm")
    assert body["counts"]["failed"] < 50  # not every node "gone"
    assert any("showing its last answer" in e for e in body["errors"])


async def test_a_page_whose_data_is_past_the_bound_says_it_is_stale() -> None:
    app, source = fleet_app(100, fresh_s=0.1, max_age_s=0.3)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    hung = asyncio.Event()
    read = source.slurm_nodes

    async def slurm_hangs() -> Any:
        await hung.wait()
        return await read()

    async with httpx.AsyncClient(transport=transport, base_url="http://c.test", headers=AUTH) as c:
        # Fresh first (awaited: on a busy machine one read and render can outlast 0.3 s).
        await eventually(lambda: _fresh_page(c), 10, "a fresh page first")
        source.slurm_nodes = slurm_hangs  # type: ignore[method-assign]

        async def stale_page() -> httpx.Response | None:
            page = await c.get("/ui/topology")
            return page if 'class="age stale"' in page.text else None

        page = await eventually(stale_page, 10, "the page to say its data is stale")
        assert "stale: the data is" in page.text

        async def says_why() -> httpx.Response | None:
            # The hung read is abandoned at the bound (0.3 s after it began): then the
            # answer says why the data ages, as well as that it does.
            page = await c.get("/ui/topology")
            return page if "longer than 0.3 s" in page.text else None

        page = await eventually(says_why, 10, "the page to say why")
        assert page.text.count('<a class="tile ') == 100  # the last data, still shown
        poll = await c.get("/ui/api/topology")
        assert "longer than 0.3 s" in poll.headers["x-console-read-error"]
        hung.set()
        await eventually(lambda: _fresh_page(c), 10, "fresh data again")
    await app.state.console.shared.aclose()


async def _fresh_page(c: httpx.AsyncClient) -> bool:
    page = await c.get("/ui/topology")
    return 'class="age"' in page.text and "stale:" not in page.text


async def test_no_read_at_all_in_time_is_unknown_not_an_empty_cluster() -> None:
    app, source = fleet_app(100, fresh_s=0.2, max_age_s=0.3)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))

    async def hangs() -> Any:
        await asyncio.Event().wait()

    source.slurm_nodes = hangs  # type: ignore[method-assign]
    async with httpx.AsyncClient(transport=transport, base_url="http://c.test", headers=AUTH) as c:
        asked = time.monotonic()
        page = await c.get("/ui/topology")
        assert time.monotonic() - asked < 2.0  # bounded: the first viewer is not held
        assert "Nodes unknown: the cluster could not be read" in page.text
        assert "no answer within 0.3 s" in page.text or "longer than 0.3 s" in page.text
        poll = await c.get("/ui/api/topology")
        assert poll.json()["pods"] == [] and poll.json()["errors"] and "etag" not in poll.headers
    await app.state.console.shared.aclose()


async def test_a_read_cancelled_before_its_sources_start_leaves_no_read_behind() -> None:
    # ci23's warnings: a read cancelled (a viewer gone, the app closing) between gather
    # making its tasks and their first step left the sources' coroutines made and never
    # awaited. Each source's read is now made where it is awaited.
    source = FleetSource(10)
    made: list[str] = []
    for name in ("slurm_nodes", "cluster", "guard", "open_incidents"):
        read = getattr(source, name)

        def counted(read: Any = read, name: str = name) -> Any:
            made.append(name)
            return read()

        setattr(source, name, counted)
    task = asyncio.create_task(
        read_cluster(cluster="c1", source=source, policy=Policy, previous=None, stale_after_s=1.0)
    )
    await asyncio.sleep(0)  # one step: read_cluster is at its gather, its tasks not started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert made == []
    # And uncancelled, every source is read once.
    read = await read_cluster(
        cluster="c1", source=source, policy=Policy, previous=None, stale_after_s=1.0
    )
    assert sorted(made) == ["cluster", "guard", "open_incidents", "slurm_nodes"]
    assert len(read.slurm) == 10
