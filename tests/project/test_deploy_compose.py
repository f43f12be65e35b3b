"""docker-compose.yml cannot run here (no Docker engine), so check what it promises against
the code: official images or our Dockerfile, real CLI commands, the search attributes the
workflows use, ports and URLs that meet, and settings that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from autoclusters.clients.cli.app import app
from autoclusters.clients.server import create_server
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.integrations.temporal import SEARCH_ATTRIBUTES
from tests.project.settings_names import names_a_setting

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_IMAGES = {
    "temporalio/server",
    "temporalio/admin-tools",
    "temporalio/ui",
    "postgres",
    "prom/prometheus",
    "prom/alertmanager",
    "grafana/grafana",
}
# Variables compose itself reads that are not AutoClusters settings.
COMPOSE_ONLY = {
    "TEMPORAL_DB_PASSWORD": "Temporal's PostgreSQL password",
    "GRAFANA_ADMIN_PASSWORD": "Grafana's admin password",
    "TEMPORAL_VERSION": "temporalio/server and admin-tools tag",
    "TEMPORAL_UI_VERSION": "temporalio/ui tag",
    "TEMPORAL_RETENTION": "the namespace's retention",
    "PROMETHEUS_RETENTION": "Prometheus's retention",
    "AUTOCLUSTERS_WORKERS": "worker replicas",
    "AUTOCLUSTERS_ALERTMANAGER_TOKEN": "Alertmanager's API token (file and api_tokens)",
    "AUTOCLUSTERS_AGENT_TOKEN": "the agents' API token (in api_tokens)",
    "AUTOCLUSTERS_METRICS_TOKEN": "Prometheus' scrape token (worker, api_tokens, file)",
}
CRUSOE_ENV = {"CRUSOE_ACCESS_KEY_ID", "CRUSOE_SECRET_KEY", "CRUSOE_DEFAULT_PROJECT"}
CRUSOE_ENV |= {"CRUSOE_API_ENDPOINT"}
INTERPOLATION = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _resolved(value: str) -> str:
    """A compose string with each `${VAR:-default}` as its default (`$$` is a dollar)."""
    return INTERPOLATION.sub(lambda m: m.group(2) or "", value).replace("$$", "$")


def _ours() -> dict[str, dict[str, Any]]:
    """The services built from this repo's Dockerfile."""
    return {name: s for name, s in _services().items() if "build" in s}


def _by_command(*command: str) -> tuple[str, dict[str, Any]]:
    [(name, service)] = [(n, s) for n, s in _ours().items() if s["command"] == list(command)]
    return name, service


def _env(service: dict[str, Any]) -> dict[str, str | None]:
    env: dict[str, str | None] = service.get("environment") or {}
    return env


def _mount_source(service: dict[str, Any], target: str) -> Path:
    """The host path a service mounts at `target` (or at a folder above it)."""
    for volume in service.get("volumes") or []:
        source, inside = volume.split(":")[:2]
        if target == inside or target.startswith(inside.rstrip("/") + "/"):
            return ROOT / source / target.removeprefix(inside).lstrip("/")
    raise AssertionError(f"nothing mounted at {target}")


def test_every_image_is_official_and_pinned_or_built_here() -> None:
    for name, service in _services().items():
        if "build" in service:
            assert service["build"] == ".", name
            assert "image" not in service, f"{name}: built here, not pulled"
            continue
        repo, _, tag = _resolved(service["image"]).partition(":")
        assert repo in OFFICIAL_IMAGES, f"{name}: {repo} is not an official image"
        assert tag and tag != "latest", f"{name}: pin a version"


def test_the_dockerfile_copies_what_exists_and_installs_the_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            sources = [w for w in line.split()[1:-1] if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
                copied.add(src)
    # Every layer linked into the import root is in the image, except the sandbox.
    layers = {p.name for p in (ROOT / "autoclusters").iterdir() if p.is_symlink()}
    assert layers - copied == {"sandbox"}
    assert "pyproject.toml" in copied
    assert re.search(r"^RUN pip install [^\n]*\s\.$", dockerfile, re.M)
    assert 'ENTRYPOINT ["autoclusters"]' in dockerfile


def test_our_services_run_real_cli_commands() -> None:
    runner = CliRunner()
    assert {"worker", "autoclusters-api"} <= set(_ours())
    for name, service in _ours().items():
        command = service["command"]
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0, f"{name}: `autoclusters {' '.join(command)}`: {result.output}"
        assert "Usage:" in result.output
    # A command that does not exist fails the same check.
    assert runner.invoke(app, ["api", "serve", "--help"]).exit_code != 0


def test_temporal_gets_our_search_attributes_and_our_services_wait_for_them() -> None:
    services = _services()
    setup = services["temporal-setup"]
    declared = set(_env(setup)["SEARCH_ATTRIBUTES"].split())  # type: ignore[union-attr]
    assert declared == {f"{k.name}=Keyword" for k in SEARCH_ATTRIBUTES}
    assert all(k.indexed_value_type.name == "KEYWORD" for k in SEARCH_ATTRIBUTES)
    assert _env(setup)["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert setup["depends_on"]["temporal"]["condition"] == "service_healthy"
    schema = services["temporal-schema"]
    assert services["temporal"]["depends_on"]["temporal-schema"]["condition"] == (
        "service_completed_successfully"
    )
    assert _env(schema)["SQL_PASSWORD"] == _env(services["temporal"])["POSTGRES_PWD"]
    assert _env(services["postgresql"])["POSTGRES_PASSWORD"] == _env(schema)["SQL_PASSWORD"]
    for name, service in _ours().items():
        assert service["depends_on"]["temporal-setup"]["condition"] == (
            "service_completed_successfully"
        ), name
        address = _resolved(_env(service)["AUTOCLUSTERS_TEMPORAL__ADDRESS"] or "")
        assert address == "temporal:7233", name
    ui = services["temporal-ui"]
    assert "127.0.0.1:8233:8080" in ui["ports"]


def test_alertmanager_reaches_the_api_webhook_with_its_token() -> None:
    api_name, api = _by_command("api", "run")
    env = _env(api)
    port = int(env["AUTOCLUSTERS_API_PORT"] or 0)
    assert env["AUTOCLUSTERS_API_HOST"] == "0.0.0.0"
    assert f"{port}:{port}" in api["ports"]
    routes = {
        (getattr(r, "path", ""), m)
        for r in create_server(ApiSettings(api_inventory="static")).routes
        for m in getattr(r, "methods", ())
    }
    config = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    [receiver] = [r for r in config["receivers"] if r["name"] == "autoclusters"]
    [hook] = receiver["webhook_configs"]
    url = urlsplit(hook["url"])
    assert (url.hostname, url.port) == (api_name, port)
    assert (url.path, "POST") in routes
    # The token file alertmanager.yml names is the compose secret, whose variable is the
    # token the API is given for Alertmanager.
    alertmanager = _services()["alertmanager"]
    [secret] = alertmanager["secrets"]
    assert secret["target"] == hook["http_config"]["authorization"]["credentials_file"]
    source = _compose()["secrets"][secret["source"]]["environment"]
    assert f'"alertmanager": "${{{source}:?' in (env["AUTOCLUSTERS_API_TOKENS"] or "")
    assert _mount_source(alertmanager, "/etc/alertmanager/alertmanager.yml") == (
        ROOT / "deploy/alertmanager/alertmanager.yml"
    )


def test_prometheus_scrapes_our_metrics_ports_and_loads_the_shipped_rules() -> None:
    services = _services()
    prometheus = services["prometheus"]
    config_path = _mount_source(prometheus, "/etc/prometheus/prometheus.yml")
    config = yaml.safe_load(config_path.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}

    worker_name, worker = _by_command("worker")
    [worker_sd] = jobs["autoclusters-worker"]["dns_sd_configs"]
    assert worker_sd["names"] == [worker_name]
    assert worker_sd["port"] == int(_env(worker)["AUTOCLUSTERS_WORKER__METRICS_PORT"] or 0)
    assert _env(worker)["AUTOCLUSTERS_WORKER__METRICS_HOST"] == "0.0.0.0"

    api_name, api = _by_command("api", "run")
    [api_sd] = jobs["autoclusters-api"]["dns_sd_configs"]
    assert api_sd["names"] == [api_name]
    assert api_sd["port"] == int(_env(api)["AUTOCLUSTERS_API_PORT"] or 0)
    assert jobs["autoclusters-api"].get("metrics_path", "/metrics") == "/metrics"
    assert _env(api)["AUTOCLUSTERS_MONITORING__PROMETHEUS_URL"] == "http://prometheus:9090"

    # Every /metrics off loopback asks for a token: each job shows the file compose mounts
    # from AUTOCLUSTERS_METRICS_TOKEN, the worker is given that token and the API takes it
    # from the caller `prometheus`, a reader (it may scrape and read, nothing more).
    [secret] = prometheus["secrets"]
    for job in jobs.values():
        assert job["authorization"]["credentials_file"] == secret["target"], job["job_name"]
    source = _compose()["secrets"][secret["source"]]["environment"]
    assert (_env(worker)["AUTOCLUSTERS_WORKER__METRICS_TOKEN"] or "").startswith(f"${{{source}:?")
    grant = f'"prometheus": {{"role": "reader", "token": "${{{source}:?'
    assert grant in (_env(api)["AUTOCLUSTERS_API_TOKENS"] or "")

    for rule_file in config["rule_files"]:
        assert (config_path.parent / rule_file).is_file()
    assert "gpu-alerts.yml" in config["rule_files"]
    [am] = config["alerting"]["alertmanagers"]
    assert am["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "alertmanager" in services
    for sd in jobs["gpu-nodes"]["file_sd_configs"]:
        for pattern in sd["files"]:
            assert list(config_path.parent.glob(pattern)), pattern


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_prometheus_config(tmp_path: Path) -> None:
    # promtool checks that the token file exists: the compose secret's path, here a file.
    shutil.copytree(ROOT / "deploy/prometheus", tmp_path / "prometheus")
    config = tmp_path / "prometheus/prometheus.yml"
    token = tmp_path / "metrics-token"
    token.write_text("t")
    text = config.read_text()
    assert "/run/secrets/metrics-token" in text
    config.write_text(text.replace("/run/secrets/metrics-token", str(token)))
    done = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_provisions_the_dashboard_on_the_compose_prometheus() -> None:
    grafana = _services()["grafana"]
    provisioning = _mount_source(grafana, "/etc/grafana/provisioning")
    providers = yaml.safe_load((provisioning / "dashboards/autoclusters.yml").read_text())
    [provider] = providers["providers"]
    dashboard_dir = provider["options"]["path"]
    assert _mount_source(grafana, f"{dashboard_dir}/autoclusters.json") == (
        ROOT / "deploy/grafana/autoclusters.json"
    )
    sources = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())
    [source] = sources["datasources"]
    assert (source["type"], source["url"], source["isDefault"]) == (
        "prometheus",
        "http://prometheus:9090",
        True,
    )


def _compose_variables() -> set[str]:
    text = (ROOT / "docker-compose.yml").read_text()
    names = {m.group(1) for m in INTERPOLATION.finditer(text)}
    names |= {s for s in re.findall(r"\$\$(\w+)", text)}  # the containers' own shell vars
    for service in _ours().values():
        names |= {k for k, v in _env(service).items() if v is None}  # passed from .env
    names |= {v["environment"] for v in (_compose().get("secrets") or {}).values()}
    return names


def _documented() -> set[str]:
    """Every variable .env.example sets or shows (commented out)."""
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^#?([A-Z][A-Z0-9_]+)=", text, re.M))


def test_every_setting_passed_to_our_services_exists() -> None:
    for name, service in _ours().items():
        for var in _env(service):
            if var.startswith("AUTOCLUSTERS_") and var not in COMPOSE_ONLY:
                assert names_a_setting(var), f"{name}: {var}"
            else:
                assert var in CRUSOE_ENV | {"SLURM_CONF"}, f"{name}: {var}"
    assert _by_command("worker")[1]["environment"].keys() >= CRUSOE_ENV
    assert not CRUSOE_ENV & _env(_by_command("api", "run")[1]).keys()  # the API needs none


def test_env_example_documents_exactly_what_compose_reads() -> None:
    used = {v for v in _compose_variables() if not v.islower()}
    used -= {"NAMESPACE", "RETENTION", "SEARCH_ATTRIBUTES"}  # the containers' own
    fixed = {
        k for s in _ours().values() for k, v in _env(s).items() if v is not None and "${" not in v
    }
    documented = _documented()
    assert used - fixed <= documented, used - fixed - documented
    assert documented <= used | {"AUTOCLUSTERS_TEMPORAL__ADDRESS"}, documented - used
    for var in documented - COMPOSE_ONLY.keys() - CRUSOE_ENV:
        assert names_a_setting(var), var
    # What compose refuses to start without is set (to a placeholder) in the example.
    text = (ROOT / "docker-compose.yml").read_text()
    required = {m.group(1) for m in re.finditer(r"\$\{(\w+):\?", text)}
    set_there = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert required <= set_there


def test_compose_config_mount_holds_a_valid_policy() -> None:
    from autoclusters.core.policy import load_policy

    for service in _ours().values():
        policy_path = _env(service)["AUTOCLUSTERS_POLICY_FILE"] or ""
        assert policy_path.startswith("/etc/autoclusters/")
        load_policy(_mount_source(service, policy_path))
        assert "/run/munge:/run/munge" in service["volumes"]
        assert "/etc/slurm:/etc/slurm:ro" in service["volumes"]
