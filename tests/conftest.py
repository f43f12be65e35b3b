"""Shared fixtures: a real sandbox (Temporal dev server, munge, Slurm, a worker) per xdist
worker that runs tests on it, and the matrices' sandboxes (tests/matrix_sandbox.py).

The sandbox gets its own state dir and free ports so it never collides with a user's
demo sandbox, and is stopped by PID after the worker's last test on it; then checked: nothing
it recorded is still alive, nor any process naming its state dir (one the table never knew).

Every test is hermetic: HOME is a temporary directory and no AUTOCLUSTERS_* variable is
set (for the session, so the processes the session's sandboxes start inherit neither, and
again for each test), so no test reads a user's ~/.autoclusters or their environment.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import settings as hypothesis_settings
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import SandboxSettings, SlurmSettings, TemporalSettings
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.runtime.config import PORT_SPAN, SandboxConfig
from tests import default_tls
from tests.helpers import down_leaving_nothing, time_skipping_env
from tests.leftover_sandboxes import stop_left_running
from tests.matrix_sandbox import matrix_sandboxes
from tests.worker_sandbox import WorkerSandbox

# Fuzz tests: 300 examples each in `make test`; `make unit` asks for the quick profile.
hypothesis_settings.register_profile("full", max_examples=300)
hypothesis_settings.register_profile("quick", max_examples=60)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "full"))

# Every httpx client the product makes under test shares one default TLS context per process
# instead of loading the CA bundle again (~45 ms of CPU each: tests/default_tls.py).
default_tls.install()


def _isolate(mp: pytest.MonkeyPatch, home: Path) -> None:
    mp.setenv("HOME", str(home))
    for name in list(os.environ):
        if name.startswith("AUTOCLUSTERS_"):
            mp.delenv(name)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Before any session fixture (a sandbox) starts: a private HOME, no AUTOCLUSTERS_*."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, home)
        yield home


@pytest.fixture(autouse=True)
def _hermetic(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test: a HOME of its own (nothing a test writes there reaches another), and
    whatever AUTOCLUSTERS_* a previous test set is gone."""
    home = tmp_path_factory.mktemp("home")
    _isolate(monkeypatch, home)
    return home


# Fixtures that start a server: a test using one (directly or through another fixture) is
# never in `make unit`. Decided by what the test uses, not by what its module imports.
SERVER_FIXTURES = {"sandbox": "integration", "matrix_sandbox": "integration", "env": "workflow"}

# Tests on the session's shared sandbox run in this many xdist groups: each group is one
# worker's sandbox, started once and used by its tests one at a time (as before xdist).
# More groups would start more sandboxes (~35 s and ~10 s of CPU each) for little gain.
SHARED_SANDBOX_GROUPS = 2
# The longest users of the shared sandbox, dealt so the two groups carry about the same
# work; the rest go by a hash of their module's name. Each group is one worker's chain of
# tests, one after another: the longer of the two bounds the run's wall. Measured by test
# (2026-12-06, seven workers): group 1 held the training module's sandbox tests (365 s),
# the lifecycle (183 s), the incident tests (96 s) and the standby holders (57 s), 702 s
# of the run's 750 s, against group 0's 343 s; the lifecycle moved to group 0.
SHARED_SANDBOX_TURNS = {
    "test_packaging": 0,
    "test_sandbox_lifecycle": 0,
    "test_incident_on_sandbox": 1,
}

# Where xdist starts: the modules whose work takes longest, so the run does not end waiting
# on one of them that started last (measured with --durations; the order changes when a
# test runs, never what it checks). Everything else follows: integration tests, then
# workflow tests, then unit tests, which fill the gaps.
LONGEST_FIRST = (
    # The demo's and the storm's checks are timed: they start before the sandboxes' boots
    # load the machine, and the demo's two tests (side by side) are the longest single ones.
    "test_demo",
    "test_api",
    "test_outage_matrix",
    "test_sandbox_lifecycle",
    "test_chaos_matrix",
    "test_training",
    "test_incident_on_sandbox",
    "test_restart",
    "test_cluster_on_sandbox",
    "test_chaos",
    "test_remediation_workflow",
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made lives as long as the process: frozen, the
    collector's full passes stop walking it again and again (each xdist worker holds ~240k
    objects after collecting; a full pass over them cost ~0.2 s, ~13 a worker in the unit
    lane). Nothing a test makes is frozen."""
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An interrupted run (Ctrl-C, a fixture that timed out) skips the teardowns that stop
    sandboxes: any sandbox under this run's temporary directory still running goes down,
    by its recorded PIDs (tests/leftover_sandboxes.py)."""
    for shared in _worker_sandboxes.values():  # a run that ended before its last user's teardown
        shared.stop()
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    for state in stop_left_running(factory.getbasetemp()):
        print(f"\nstopped a sandbox this run left running: {state}")


# tryfirst: xdist's worker turns xdist_group marks into the node ids it schedules by in
# its own hook, which must see ours.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test on the session's real sandbox is an integration test, marked or not; a test
    that uses a Temporal server (the `env` fixture: the time-skipping server here, or a
    module's own dev server) is at least a `workflow` test. Then each test gets its xdist
    group (`--dist loadgroup`) and the longest work is put first."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in SERVER_FIXTURES.items():
            if fixture in used and not item.get_closest_marker("integration"):
                item.add_marker(getattr(pytest.mark, marker))
        group = xdist_group(item)
        if group and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=_start_order)


# Modules whose tests are CPU-bound (torch on every rank): each runs its tests one at a time
# in one worker, so that no more than one of them competes for the two cores at once (side
# by side, five torchrun jobs starved each other past their waits). The demo's two tests
# are not: one after the other they were the run's longest chain (~550 s beside the suite).
CPU_BOUND_MODULES = ("test_training",)


def xdist_group(item: pytest.Item) -> str | None:
    """Tests that share a server must run in one xdist worker, one at a time: those on the
    session's sandbox (in SHARED_SANDBOX_GROUPS groups), and a module's tests that share one
    of its module-scoped fixtures (its own sandbox, dev server or time-skipping server).
    A test with neither can run anywhere. A module may split itself further by marking its
    tests `xdist_group` (the matrices do: one sandbox per group)."""
    module = item.nodeid.split("::", 1)[0]
    used = set(getattr(item, "fixturenames", ()))
    if "sandbox" in used:
        turn = SHARED_SANDBOX_TURNS.get(Path(module).stem)
        if turn is None:
            turn = zlib.crc32(module.encode()) % SHARED_SANDBOX_GROUPS
        return f"shared-sandbox-{turn}"
    if Path(module).stem in CPU_BOUND_MODULES:
        return module
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    if any(defs[name][-1].scope in ("module", "package", "class") for name in used & defs.keys()):
        return module
    return None


def _start_order(item: pytest.Item) -> tuple[int, int]:
    stem = Path(item.nodeid.split("::", 1)[0]).stem
    if stem in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(stem)
    if item.get_closest_marker("integration"):
        return 1, 0
    if item.get_closest_marker("workflow"):
        return 2, 0
    return 3, 0


_handed_out: set[int] = set()

# Ports that torch's tests take without asking for a free one: torchrun's defaults (the
# c10d rendezvous's 29400, the static rendezvous's 29500, which test_training holds with
# a listener of its own). A sandbox whose range held one lost its agent to "Address
# already in use" (ci15 of 2026-12-06: gpu-01's /metrics on 29500, and the provisioning's
# health gate waited for its first report past the test's 180 s).
TORCH_DEFAULT_PORTS = (29400, 29500)


def port_slots(worker: int, workers: int, span: int) -> list[int]:
    """The bases xdist worker `worker` of `workers` may hand out: 200 apart, none of whose
    ranges holds one of torch's default ports."""
    return [
        b
        for i, b in enumerate(range(10000, 32400, 200))
        if i % workers == worker and not any(b <= p < b + span for p in TORCH_DEFAULT_PORTS)
    ]


def free_port_base(span: int = PORT_SPAN) -> int:
    """A base port with `span` free ports after it, so parallel sandboxes never collide
    (a sandbox uses up to port_base + PORT_SPAN - 1, the last agent's /metrics: SandboxConfig).

    Ranges stay below the kernel's ephemeral ports (ip_local_port_range starts at 32768):
    there, any outgoing connection of the many the sandbox makes may take a port as its
    source between this check and the daemon's bind (slurmctld's "Address already in use"
    in one CI run). A base is handed out once per session, because a base chosen for a
    sandbox that has not started yet still looks free."""
    # Under xdist each worker draws from its own slots, so two workers never race for one.
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slots = port_slots(worker, workers, span)
    for _ in range(200):
        base = random.choice(slots)  # 200 > PORT_SPAN: ranges never overlap
        if base in _handed_out:
            continue
        ok = True
        for port in range(base, base + span):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            _handed_out.add(base)
            return base
    raise RuntimeError("no free port range")


@pytest_asyncio.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server, one per test module (a module that needs the dev
    server instead defines its own `env`)."""
    async with await time_skipping_env() as environment:  # shut down on the way out
        yield environment


# The sandboxes a worker shares between its tests (tests/worker_sandbox.py), by fixture
# name: booted at the first test that uses one, stopped after the last.
_worker_sandboxes: dict[str, WorkerSandbox] = {}


def _worker_sandbox(
    fixture: str, factory: pytest.TempPathFactory, make: Callable[[Path, int], WorkerSandbox]
) -> SandboxConfig:
    if fixture not in _worker_sandboxes:
        _worker_sandboxes[fixture] = make(factory.mktemp(fixture), free_port_base())
    return _worker_sandboxes[fixture].get()


def _shared_sandbox(state_dir: Path, port_base: int) -> WorkerSandbox:
    cfg = SandboxConfig(
        state_dir=state_dir,
        cluster="test",
        nodes=4,
        port_base=port_base,
        boot_delay_s=3,
        # Many tests share this cluster within minutes: not a systemic failure.
        breaker_threshold=100,
    )
    return WorkerSandbox("sandbox", cfg, down=down_leaving_nothing)


@pytest.fixture
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> SandboxConfig:
    """The worker's shared sandbox (a group of tests, SHARED_SANDBOX_GROUPS): booted at its
    first test, stopped after its last, checked to leave nothing running."""
    return _worker_sandbox("sandbox", tmp_path_factory, _shared_sandbox)


@pytest.fixture
def matrix_sandbox(tmp_path_factory: pytest.TempPathFactory) -> SandboxConfig:
    """The matrices' sandbox of this worker (tests/matrix_sandbox.py): booted at its first
    matrix case, stopped after its last."""
    return _worker_sandbox("matrix_sandbox", tmp_path_factory, matrix_sandboxes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    for shared in _worker_sandboxes.values():
        shared.stop_after(item, nextitem)


@pytest.fixture
def sandbox_settings(sandbox: SandboxConfig) -> Settings:
    return Settings(
        cluster=sandbox.cluster,
        temporal=TemporalSettings(address=sandbox.temporal_address, task_queue=sandbox.task_queue),
        slurm=SlurmSettings(conf=sandbox.slurm_conf),
        sandbox=SandboxSettings(state_dir=sandbox.state_dir, boot_delay_s=sandbox.boot_delay_s),
    )


@pytest_asyncio.fixture
async def sandbox_client(sandbox_settings: Settings) -> AsyncIterator[Client]:
    yield await temporal.connect(sandbox_settings)


@pytest.fixture
def slurm(sandbox: SandboxConfig) -> SlurmCli:
    return SlurmCli(sandbox.slurm_conf)


@pytest.fixture
def cli_env(sandbox: SandboxConfig) -> dict[str, str]:
    """Environment for running the real `autoclusters` CLI against the test sandbox."""
    return {
        **os.environ,
        "AUTOCLUSTERS_CONFIG": str(sandbox.settings_file),
        "SLURM_CONF": str(sandbox.slurm_conf),
    }


JOB_SCRIPT = Path(__file__).resolve().parents[1] / "sandbox" / "machines" / "jobs" / "progress.sh"
