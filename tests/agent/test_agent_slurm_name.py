"""The agent on Slurm in Kubernetes (Slinky on CMK): `--node` is its Kubernetes Node and
`--slurm-name-from-node` makes it report as the Slurm node Slinky runs there (the Node's
hostname-override annotation, else its name), against the in-process Kubernetes emulator:

- a Node with the override reports as the Slurm node, one without as its own name;
- a Node named by the runbook after the agent started: the agent stops (exit 3) so that its
  pod starts again under the new name; an override once read is not followed;
- a Node that cannot be read is never taken for one without the override: the agent waits
  and says why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from autoclusters.clients.agent import slurm_name
from autoclusters.clients.agent.slurm_name import SlurmName
from autoclusters.clients.cli import agent as agent_cli
from autoclusters.core.node_report import NodeReport
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import HOSTNAME_OVERRIDE
from autoclusters.sandbox.kubernetes.emulator import Running, running
from tests.agent.test_agent_cli import cli, needs_no_driver
from tests.emulators.test_kubernetes import write_kubeconfig
from tests.helpers import eventually

TOKEN = "agent-name-token"


@pytest.fixture
def emulator() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu


@pytest.fixture
def kubeconfig(emulator: Running, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", emulator.url, TOKEN)


@pytest.fixture
def core(kubeconfig: Path) -> Iterator[client.CoreV1Api]:
    with api_client(kubeconfig=kubeconfig) as api:
        yield client.CoreV1Api(api)


def node(core: client.CoreV1Api, name: str, override: str | None = None) -> None:
    meta: dict[str, Any] = {"name": name}
    if override:
        meta["annotations"] = {HOSTNAME_OVERRIDE: override}
    core.create_node({"metadata": meta})


def name_it(core: client.CoreV1Api, name: str, override: str) -> None:
    core.patch_node(name, {"metadata": {"annotations": {HOSTNAME_OVERRIDE: override}}})


@needs_no_driver
def test_the_agent_reports_as_the_slurm_node_on_its_kubernetes_node(
    core: client.CoreV1Api, kubeconfig: Path, tmp_path: Path
) -> None:
    node(core, "np-pool-2", override="gpu-02")
    node(core, "gpu-05")
    for kube, slurm in (("np-pool-2", "gpu-02"), ("gpu-05", "gpu-05")):
        fake = tmp_path / f"{kube}.json"
        assert cli("inject", "--node", slurm, "--fault", "XID_79", "--fake-file", str(fake))
        p = cli("agent", "run", "--node", kube, "--slurm-name-from-node",
                "--kubeconfig", str(kubeconfig), "--backend", "fake", "--fake-file", str(fake),
                "--once", "--print")  # fmt: skip
        assert p.returncode == 1, p.stderr
        (line,) = p.stdout.splitlines()
        assert NodeReport.model_validate_json(line).node == slurm


@needs_no_driver
def test_a_node_named_after_the_agent_started_restarts_it_under_that_name(
    core: client.CoreV1Api,
    kubeconfig: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    node(core, "np-pool-3")
    reads = threading.Semaphore(0)

    class Counted(SlurmName):
        def read(self) -> str:
            name = super().read()
            reads.release()
            return name

    def quick(kube_node: str, settings: Any) -> SlurmName:
        return Counted(api_client(kubeconfig=settings.kubeconfig), kube_node, first_s=0.05)

    monkeypatch.setattr(agent_cli, "_namer", quick)

    def the_runbook_names_it() -> None:
        assert reads.acquire(timeout=30)  # the agent has read its name: np-pool-3
        name_it(core, "np-pool-3", "gpu-03")

    runbook = threading.Thread(target=the_runbook_names_it)
    runbook.start()
    fake = tmp_path / "np-pool-3.json"
    p = cli("agent", "run", "--node", "np-pool-3", "--slurm-name-from-node",
            "--kubeconfig", str(kubeconfig), "--backend", "fake", "--fake-file", str(fake),
            "--print", "--interval", "30")  # fmt: skip
    runbook.join()
    assert p.returncode == 3, p.stderr
    assert "Slurm node gpu-03 now, not np-pool-3" in caplog.text


def test_an_override_is_read_once_and_not_followed(
    core: client.CoreV1Api, kubeconfig: Path
) -> None:
    node(core, "np-pool-4", override="gpu-04")
    with api_client(kubeconfig=kubeconfig) as api:
        namer = SlurmName(api, "np-pool-4", first_s=0.01)
        assert namer.read() == "gpu-04"
        changes: list[str] = []
        namer.follow("gpu-04", threading.Event(), changes.append)  # returns at once
        assert changes == []


async def test_a_node_that_cannot_be_read_is_waited_for_not_guessed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    refused = write_kubeconfig(tmp_path / "refused", "http://127.0.0.1:9", TOKEN)
    caplog.set_level(logging.WARNING, logger=slurm_name.__name__)
    stop = threading.Event()
    found: list[str | None] = []
    with api_client(kubeconfig=refused) as api:
        namer = SlurmName(api, "np-pool-5", first_s=0.01, max_s=0.05, request_timeout_s=2)
        waiting = threading.Thread(target=lambda: found.append(namer.wait_read(stop)))
        waiting.start()

        async def tried_twice() -> bool:
            return caplog.text.count("cannot read Kubernetes Node np-pool-5") >= 2

        await eventually(tried_twice, what="two failed reads")
        stop.set()
        waiting.join(timeout=30)
    assert found == [None]
