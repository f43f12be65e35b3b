"""The shared settings' groups (core/settings.py, core/settings_groups.py):

- a group is a TOML table and AUTOCLUSTERS_<GROUP>__<NAME> in the environment, and the
  environment overrides one key of a table while the file's other keys stay;
- each group keeps its checks (key lengths, empty-is-unset), naming the group in the error;
- a setting's old flat name, in a file or in the environment, is refused with its new place
  (ignored, it would silently leave the default in force);
- the file a sandbox writes for its processes reads back as the settings it meant.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.settings import Settings, load_file
from autoclusters.sandbox.runtime.config import SandboxConfig

FILE = """
cluster = "c9"
api_port = 9000

[temporal]
address = "temporal.file:7233"
namespace = "from-file"
tls_cert = ""

[monitoring]
alert_node_label = "node"
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "autoclusters.toml"
    path.write_text(FILE)
    monkeypatch.setenv("AUTOCLUSTERS_CONFIG", str(path))
    return path


@pytest.mark.usefixtures("config")
def test_the_environment_overrides_one_key_of_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__ADDRESS", "temporal.env:7233")
    monkeypatch.setenv("AUTOCLUSTERS_WORKER__METRICS_PORT", "9464")
    s = Settings()
    assert (s.temporal.address, s.temporal.namespace) == ("temporal.env:7233", "from-file")
    assert s.temporal.tls_cert is None  # empty in the file: unset, not the path "."
    assert (s.cluster, s.worker.metrics_port, s.monitoring.alert_node_label) == ("c9", 9464, "node")
    # The API's own settings (api_*, flat) come from the same file.
    api = ApiSettings()
    assert (api.api_port, api.temporal.address) == (9000, "temporal.env:7233")


def test_a_group_keeps_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOCLUSTERS_APPROVAL__KEYS", '["short"]')
    with pytest.raises(ValidationError, match=r"approval\.keys\n.*at least 32 characters"):
        Settings()
    monkeypatch.delenv("AUTOCLUSTERS_APPROVAL__KEYS")
    monkeypatch.setenv("AUTOCLUSTERS_HANDOFF__SECRET", "short")
    with pytest.raises(ValidationError, match=r"handoff\.secret\n.*at least 32 characters"):
        Settings()


def test_an_old_name_in_the_environment_is_refused_with_its_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL_ADDRESS", "temporal.old:7233")
    with pytest.raises(ValidationError, match="AUTOCLUSTERS_TEMPORAL__ADDRESS"):
        Settings()


def test_an_old_name_in_the_file_is_refused_with_its_new_place(
    config: Path,
) -> None:
    config.write_text('cluster = "c9"\nworker_metrics_port = 9464\n')
    with pytest.raises(
        ValidationError, match=r"worker_metrics_port is now \[worker\] metrics_port"
    ):
        Settings()


def test_the_sandbox_file_reads_back_as_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, port_base=21000, cluster="sbx", boot_delay_s=3)
    cfg.settings_file.write_text(cfg.settings_toml())
    s = load_file(cfg.settings_file)
    assert (s.cluster, s.policy_file) == ("sbx", cfg.policy_file)
    assert (s.temporal.address, s.temporal.task_queue) == (cfg.temporal_address, cfg.task_queue)
    assert (s.slurm.conf, s.kubernetes.kubeconfig) == (cfg.slurm_conf, None)
    assert (s.sandbox.state_dir, s.sandbox.boot_delay_s) == (tmp_path, 3)
    assert (s.crusoe.config_file, s.crusoe.poll_s) == (cfg.crusoe_config, 0.5)
    assert s.remediation.admission_poll_s == 5
    assert s.worker.metrics_port == cfg.worker_metrics_port
    assert s.monitoring.alertmanager_url == cfg.alertmanager_url
    assert s.console.loopback_open and s.api_base_url() == cfg.api_url
    monkeypatch.setenv("AUTOCLUSTERS_CONFIG", str(cfg.settings_file))
    api = ApiSettings()
    assert (api.api_port, api.api_inventory) == (cfg.api_port, "slurm")
