"""/metrics of the worker and the agent: open on loopback, behind a token anywhere else
(the agent's own loop refusing is in test_agent_metrics.py)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.settings import Settings
from autoclusters.integrations.metrics_http import MetricsServer, OpenMetricsRefused


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("demo_scrapes", "a series to find", registry=registry).inc()
    return registry


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "gpu-01.internal"])
def test_off_loopback_without_a_token_nothing_is_served(host: str) -> None:
    with pytest.raises(OpenMetricsRefused, match="token"):
        MetricsServer(_registry(), host, 0)


def test_with_a_token_a_scrape_must_show_it() -> None:
    server = MetricsServer(_registry(), "127.0.0.1", 0, token="s3cret")
    try:
        with httpx.Client(trust_env=False, timeout=5) as http:
            bare = http.get(server.url)
            wrong = http.get(server.url, headers={"Authorization": "Bearer s3cre"})
            basic = http.get(server.url, auth=("prometheus", "s3cret"))
            right = http.get(server.url, headers={"Authorization": "Bearer s3cret"})
    finally:
        server.stop()
    for refused in (bare, wrong, basic):
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert b"demo_scrapes" not in refused.content
    assert right.status_code == 200 and b"demo_scrapes_total 1.0" in right.content


def test_on_loopback_without_a_token_it_is_open_and_stops() -> None:
    server = MetricsServer(_registry(), "127.0.0.1", 0)
    url = server.url
    try:
        assert b"demo_scrapes_total" in httpx.get(url, timeout=5, trust_env=False).content
    finally:
        server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url, timeout=2, trust_env=False)


def test_the_worker_and_the_agent_read_their_tokens_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AUTOCLUSTERS_WORKER__METRICS_TOKEN", "w-token")
    monkeypatch.setenv("AUTOCLUSTERS_AGENT_METRICS_TOKEN", "a-token")
    worker = Settings()
    agent = AgentSettings()
    assert worker.worker.metrics_token is not None
    assert worker.worker.metrics_token.get_secret_value() == "w-token"
    assert agent.metrics_token is not None and agent.metrics_token.get_secret_value() == "a-token"
    assert "a-token" not in repr(agent) and "w-token" not in repr(worker)


def test_with_a_version_the_page_is_rendered_again_only_when_it_changes() -> None:
    registry = CollectorRegistry()
    scrapes = Counter("demo_scrapes", "a series that moves", registry=registry)
    version = [1]
    server = MetricsServer(registry, "127.0.0.1", 0, version=lambda: version[0])
    plain = {"Accept": "text/plain"}
    open_metrics = {"Accept": "application/openmetrics-text;version=1.0.0"}
    try:
        with httpx.Client(trust_env=False, timeout=5) as http:
            first = http.get(server.url, headers=plain)
            scrapes.inc()  # the version unchanged: the page as rendered
            cached = http.get(server.url, headers=plain)
            other_format = http.get(server.url, headers=open_metrics)  # rendered for its Accept
            version[0] = 2
            renewed = http.get(server.url, headers=plain)
    finally:
        server.stop()
    assert b"demo_scrapes_total 0.0" in first.content
    assert cached.content == first.content
    assert cached.headers["content-type"] == first.headers["content-type"]
    assert b"demo_scrapes_total 1.0" in other_format.content
    assert other_format.headers["content-type"].startswith("application/openmetrics-text")
    assert b"demo_scrapes_total 1.0" in renewed.content
