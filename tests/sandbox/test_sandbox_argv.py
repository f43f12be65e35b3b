"""A sandbox start must not fail one time in 64: the Kubernetes emulator's token is
urlsafe base64, which may begin with "-"; passed as a separate argument argparse read it as
the next option ("argument --token: expected one argument"), as a CI run of the outage
matrix showed."""

from __future__ import annotations

import base64
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from autoclusters.sandbox.kubernetes import emulator as k8s_emulator
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import kubernetes_mode as slinky


def test_a_token_that_begins_with_a_dash_reaches_the_emulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, cluster="c", nodes=2, port_base=20000)
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "token").write_text("-Xy_z-token\n")
    seen: dict[str, object] = {}

    def create_app(token: str, **_: object) -> object:
        seen["token"] = token
        return SimpleNamespace(state=SimpleNamespace(store=None))

    def certificate(d: Path) -> tuple[Path, Path]:
        seen["cert_dir"] = d
        return d / "tls.crt", d / "tls.key"

    async def serve(*_: object) -> None:
        seen["served"] = True

    # Everything but the argument parsing is stubbed out.
    monkeypatch.setattr(k8s_emulator, "create_app", create_app)
    monkeypatch.setattr(k8s_emulator, "certificate", certificate)
    monkeypatch.setattr(k8s_emulator, "_bind", lambda host, port: None)
    monkeypatch.setattr(k8s_emulator, "_server", lambda app, tls: None)
    monkeypatch.setattr(k8s_emulator, "_serve", serve)
    argv = slinky.k8s_emulator_argv(cfg)
    k8s_emulator.main(argv[argv.index("autoclusters.sandbox.kubernetes.emulator") + 1 :])
    assert seen["token"] == "-Xy_z-token" and seen["served"]
    assert seen["cert_dir"] == cfg.k8s_ca.parent  # the certificate the kubeconfig trusts


def test_the_one_kubeconfig_is_https_with_the_token_and_the_ca(tmp_path: Path) -> None:
    """`prepare` writes the sandbox's only kubeconfig: the emulator's HTTPS address, the CA
    of the certificate it will present, and the token (kubectl sends it only over TLS)."""
    cfg = SandboxConfig(state_dir=tmp_path, cluster="c", nodes=2, port_base=20000)
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "token").write_text("-Xy_z-token\n")
    slinky.prepare(cfg)
    doc = yaml.safe_load(cfg.kubeconfig.read_text())
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == "https://127.0.0.1:20005" == cfg.k8s_url
    assert base64.b64decode(cluster["certificate-authority-data"]).decode() == (
        cfg.k8s_ca.read_text()
    )
    assert doc["users"][0]["user"]["token"] == "-Xy_z-token"
    assert oct(cfg.kubeconfig.stat().st_mode & 0o777) == "0o600"
    first = cfg.k8s_ca.read_text()
    slinky.prepare(cfg)  # a second `sandbox up` keeps the certificate clients trust
    assert cfg.k8s_ca.read_text() == first
