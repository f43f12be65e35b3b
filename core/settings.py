"""Settings for every entry point: environment (AUTOCLUSTERS_*) over a TOML file over defaults.

The file is named by AUTOCLUSTERS_CONFIG; without it, a running default sandbox's file is
used, so `autoclusters incident open ...` just works after `autoclusters sandbox up`.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from autoclusters.core.policy import Policy, default_policy, load_policy
from autoclusters.core.slack_config import SlackConfig

DEFAULT_SANDBOX_DIR = Path.home() / ".autoclusters" / "sandbox"
CONFIG_FILE_NAME = "autoclusters.toml"


def config_file() -> Path | None:
    if os.environ.get("AUTOCLUSTERS_CONFIG"):
        return Path(os.environ["AUTOCLUSTERS_CONFIG"])
    default = DEFAULT_SANDBOX_DIR / CONFIG_FILE_NAME
    return default if default.exists() else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOCLUSTERS_", extra="ignore")

    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_ui_url: str = "http://127.0.0.1:8233"
    task_queue: str = "autoclusters"
    cluster: str = "sandbox"

    slurm_conf: Path | None = Field(default=None, description="SLURM_CONF of the cluster")
    slurm_bin_dir: Path | None = None

    # Slurm on Kubernetes (Slinky): the cluster's kubeconfig; None: Slurm only.
    kubeconfig: Path | None = None

    cloud_provider: Literal["sandbox", "crusoe"] = "sandbox"
    # Crusoe: credentials come from CRUSOE_* or ~/.crusoe/config, never from here.
    crusoe_profile: str | None = None
    crusoe_config_file: Path | None = None  # default ~/.crusoe/config
    crusoe_project_id: str | None = None  # default: the credentials' default project
    crusoe_cluster_id: str | None = None  # CMK cluster: replace through AutoClusters remediate
    crusoe_node_pool_ids: list[str] = Field(default_factory=list)  # replace = delete, pool refills
    crusoe_poll_s: float = 2
    crusoe_replace_timeout_s: float = 840  # below repair_timeout_s
    crusoe_journal: Path | None = None  # repairs in flight, so a restarted worker resumes them
    sandbox_state_dir: Path | None = None
    boot_delay_s: float = Field(default=20.0, ge=0, description="replacement VM boot time")

    # Slack: one thread per incident, approval buttons; None: Slack is off.
    slack: SlackConfig | None = None
    # Where people reach the API (the incident links in Slack).
    api_public_url: str | None = None
    expected_gpus: int = 8  # per node, for the health gate
    repair_timeout_s: float = 900
    policy_file: Path | None = Field(default=None, description="remediation policy (YAML)")
    admission_poll_s: float = 30
    log_level: str = "INFO"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def load(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def load_file(path: Path) -> Settings:
    """Exactly the settings in one TOML file (a sandbox's), whatever the environment says."""
    with open(path, "rb") as f:
        return Settings(**tomllib.load(f))


def policy_for(settings: Settings) -> Policy:
    """The cluster's remediation policy: the configured file, or the shipped default."""
    if settings.policy_file is None:
        return default_policy()
    return load_policy(settings.policy_file)
