"""Crusoe credentials: the environment over a `~/.crusoe/config` profile.

Aspects: env only (and a legacy endpoint mapped to v1), the file's profiles (top-level
`profile`, CRUSOE_PROFILE, the caller's choice), env winning over the file, and errors that
say what is missing without quoting the secret (even from a broken TOML line).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from autoclusters.integrations.crusoe import CredentialsError, load_credentials

SECRET = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")

CONFIG = f"""
profile = "lab"

[default]
access_key_id = "file-default-key"
secret_key = "{SECRET}"
default_project = "file-project"

[lab]
access_key_id = "file-lab-key"
secret_key = "{SECRET}"
api_endpoint = "http://127.0.0.1:9/v1/"
"""


def test_credentials_from_the_environment(tmp_path: Path) -> None:
    env = {
        "CRUSOE_ACCESS_KEY_ID": "env-key",
        "CRUSOE_SECRET_KEY": SECRET,
        "CRUSOE_DEFAULT_PROJECT": "env-project",
    }
    creds = load_credentials(environ=env, config_path=tmp_path / "missing")
    assert (creds.access_key_id, creds.default_project) == ("env-key", "env-project")
    assert creds.secret_key.get_secret_value() == SECRET
    assert creds.api_endpoint == "https://api.cloud.crusoe.ai/v1"
    legacy = load_credentials(
        environ=env | {"CRUSOE_API_ENDPOINT": "https://api.crusoecloud.com/v1alpha5"},
        config_path=tmp_path / "missing",
    )
    assert legacy.api_endpoint == "https://api.cloud.crusoe.ai/v1"


def test_credentials_from_the_config_file_and_env_wins(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(CONFIG)
    lab = load_credentials(environ={}, config_path=path)  # the file's top-level profile
    assert (lab.profile, lab.access_key_id, lab.api_endpoint) == (
        "lab",
        "file-lab-key",
        "http://127.0.0.1:9/v1",
    )
    default = load_credentials(environ={"CRUSOE_PROFILE": "default"}, config_path=path)
    assert (default.access_key_id, default.default_project) == ("file-default-key", "file-project")
    assert load_credentials(profile="default", environ={}, config_path=path).profile == "default"
    mixed = load_credentials(
        environ={"CRUSOE_PROFILE": "default", "CRUSOE_ACCESS_KEY_ID": "env-key"},
        config_path=path,
    )
    assert (mixed.access_key_id, mixed.default_project) == ("env-key", "file-project")


def test_missing_or_broken_credentials_say_what_without_the_secret(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="CRUSOE_SECRET_KEY"):
        load_credentials(environ={"CRUSOE_ACCESS_KEY_ID": "k"}, config_path=tmp_path / "none")
    bad_toml = tmp_path / "config"
    bad_toml.write_text(f'[default]\nsecret_key = "{SECRET}" oops\n')
    with pytest.raises(CredentialsError) as e:
        load_credentials(environ={}, config_path=bad_toml)
    assert SECRET not in str(e.value) and SECRET not in repr(e.value.__cause__)
    not_b64 = "s3cr3t/with+slashes"
    with pytest.raises(CredentialsError) as e:
        load_credentials(
            environ={"CRUSOE_ACCESS_KEY_ID": "k", "CRUSOE_SECRET_KEY": not_b64},
            config_path=tmp_path / "none",
        )
    assert not_b64 not in str(e.value)
