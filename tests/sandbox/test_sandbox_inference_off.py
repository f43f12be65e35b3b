"""A Kubernetes-mode sandbox without its inference side (`SandboxConfig(inference=False)`,
the matrices' sandboxes): `sandbox up` starts no inference kubelet or gateway, Prometheus
scrapes neither, and `sandbox load` refuses with the reason, changing nothing."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.testing import CliRunner

from autoclusters.sandbox import cli as sandbox_cli
from autoclusters.sandbox import cluster, monitoring
from autoclusters.sandbox.inference import launch as inference_sandbox
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import kubernetes_mode as slinky

INFERENCE = {inference_sandbox.KUBELET, inference_sandbox.GATEWAY}
INFERENCE_JOBS = {monitoring.GATEWAY_JOB, monitoring.SERVER_JOB}


def _scraped(cfg: SandboxConfig) -> set[str]:
    return {job["job_name"] for job in monitoring.prometheus_config(cfg)["scrape_configs"]}


def test_without_inference_nothing_of_it_starts_or_is_scraped(tmp_path: Path) -> None:
    on = SandboxConfig(state_dir=tmp_path, k8s=True)
    off = SandboxConfig(state_dir=tmp_path, k8s=True, inference=False)
    assert INFERENCE <= set(cluster._order(on)) and INFERENCE_JOBS <= _scraped(on)
    started = set(cluster._order(off))
    assert slinky.K8S_EMULATOR in started and slinky.OPERATOR in started
    assert not INFERENCE & started
    assert not INFERENCE_JOBS & _scraped(off)
    # The rest of the sandbox is the same.
    assert set(cluster._order(on)) - INFERENCE == started
    assert _scraped(on) - INFERENCE_JOBS == _scraped(off)


def test_load_is_refused_where_there_is_no_inference_side(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, k8s=True, inference=False)
    cfg.save()
    before = sorted(p.name for p in tmp_path.iterdir())
    app = typer.Typer()
    sandbox_cli.register(app)
    r = CliRunner().invoke(app, ["sandbox", "load", "--state-dir", str(tmp_path), "--rps", "5"])
    assert r.exit_code == 2, r.output
    assert "without its inference side" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == before
