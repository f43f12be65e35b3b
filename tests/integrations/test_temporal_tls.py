"""Reaching a Temporal over TLS (Temporal Cloud, or a self-hosted frontend with TLS): the
settings the deployment manifests document turn into the SDK's connect arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import TLSConfig

from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import TemporalSettings
from autoclusters.integrations import temporal


@pytest.fixture
def connect_args(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What `temporal.connect` hands the SDK (nothing is dialled)."""
    seen: dict[str, Any] = {}

    async def fake_connect(target: str, **kwargs: Any) -> str:
        seen.update(kwargs, target=target)
        return "client"

    monkeypatch.setattr(Client, "connect", fake_connect)
    return seen


async def test_plain_by_default(connect_args: dict[str, Any]) -> None:
    await temporal.connect(Settings())
    assert connect_args["target"] == "127.0.0.1:7233"
    assert connect_args["tls"] is False
    assert connect_args["api_key"] is None


async def test_api_key_from_the_environment_implies_tls(
    connect_args: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__ADDRESS", "ns.acct.tmprl.cloud:7233")
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__NAMESPACE", "ns.acct")
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__API_KEY", "k-123")
    s = Settings()
    assert "k-123" not in repr(s)  # a secret: never in logs
    await temporal.connect(s)
    assert connect_args["target"] == "ns.acct.tmprl.cloud:7233"
    assert connect_args["namespace"] == "ns.acct"
    assert connect_args["api_key"] == "k-123"
    assert connect_args["tls"] is True


async def test_mtls_reads_the_mounted_files(connect_args: dict[str, Any], tmp_path: Path) -> None:
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_bytes(f"PEM {name}".encode())
    s = Settings(
        temporal=TemporalSettings(
            tls_cert=tmp_path / "tls.crt",
            tls_key=tmp_path / "tls.key",
            tls_ca=tmp_path / "ca.crt",
            tls_server_name="temporal.internal",
        )
    )
    await temporal.connect(s)
    tls = connect_args["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == b"PEM tls.crt"
    assert tls.client_private_key == b"PEM tls.key"
    assert tls.server_root_ca_cert == b"PEM ca.crt"
    assert tls.domain == "temporal.internal"
    assert connect_args["api_key"] is None


def test_tls_flag_alone_uses_the_system_roots() -> None:
    assert temporal.tls_config(Settings(temporal=TemporalSettings(tls=True))) is True


def test_a_client_cert_without_its_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("PEM")
    with pytest.raises(ValueError, match="both"):
        temporal.tls_config(Settings(temporal=TemporalSettings(tls_cert=tmp_path / "tls.crt")))


def test_empty_values_from_placeholder_secrets_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("API_KEY", "TLS_CERT", "TLS_KEY", "TLS_CA", "TLS_SERVER_NAME"):
        monkeypatch.setenv(f"AUTOCLUSTERS_TEMPORAL__{var}", "")
    s = Settings()
    assert (s.temporal.api_key, s.temporal.tls_cert, s.temporal.tls_ca) == (None, None, None)
    assert temporal.tls_config(s) is False
