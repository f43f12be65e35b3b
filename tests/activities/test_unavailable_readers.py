"""Unknown is not empty: every reader (Prometheus, Kubernetes, the Crusoe API) answers what
the system said, or raises an outage whose ApplicationError type ends in "Unavailable";
never "no data", "no pods", "node absent" or "no VMs" for an answer it never got.

Each outage is a document the real program sends (tests/data/outages/, see its README:
captured from Debian's Prometheus and the Crusoe emulator, written from the Kubernetes
sources for the API server), replayed by a small HTTP server on loopback; connection refused
is a loopback port bound without listening. No sandbox, no Temporal server: activities run
in Temporal's ActivityEnvironment, and `workflow_sees` shows the failure exactly as the
workflow gets it (the SDK's own failure converter).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
import urllib3.util.retry
from kubernetes import client as k8s
from pydantic import SecretStr
from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.cloud import CloudActivities
from autoclusters.activities.cluster_providers.cmk import CmkProvider
from autoclusters.activities.kubernetes import KubernetesActivities, KubernetesUnavailable
from autoclusters.activities.sharing_demand import ShareDemandActivities, prometheus_value
from autoclusters.clients.console import prometheus as console_prometheus
from autoclusters.clients.console.sources import LiveSource
from autoclusters.core.cluster import ClusterRef
from autoclusters.core.kubernetes import (
    CordonNodeInput,
    EvictPodsInput,
    NodeIdentityInput,
    WaitNewNodeInput,
)
from autoclusters.core.models import PlanRepairInput
from autoclusters.core.policy import Rung
from autoclusters.core.sharing import DemandCall, SharePolicy
from autoclusters.core.unavailable import Unavailable, is_unavailable_type
from autoclusters.integrations.crusoe import (
    CrusoeClient,
    CrusoeCloud,
    CrusoeCredentials,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.resources import Operation
from autoclusters.integrations.prometheus import PrometheusUnavailable
from autoclusters.integrations.slinky_crs import CONTROLLER, KubeObjects
from tests.fakes.systems import FakeSlurm

OUTAGES = Path(__file__).parents[1] / "data" / "outages"
NODE = "gpu-01"


# --- replaying the captured documents -------------------------------------------------------


@dataclass
class Answer:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


def captured(name: str) -> Answer:
    """A document of tests/data/outages/ (`NAME.http`: status line, headers, blank line,
    body)."""
    raw = (OUTAGES / f"{name}.http").read_bytes()
    head, _, body = raw.partition(b"\n\n")
    status_line, *header_lines = head.decode().splitlines()
    _, status, reason = status_line.split(" ", 2)
    headers = [(k.strip(), v.strip()) for k, v in (h.split(":", 1) for h in header_lines)]
    return Answer(int(status), reason, headers, body)


def document(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(captured(name).body)
    return doc


def answer_json(doc: Any, status: int = 200) -> Answer:
    body = json.dumps(doc).encode()
    return Answer(status, HTTPStatus(status).phrase, [("Content-Type", "application/json")], body)


@dataclass
class Replay:
    """A loopback HTTP server: each (method, path) answers its answers in turn, the last
    one for good; anything else is a 404."""

    url: str = ""
    routes: dict[tuple[str, str], list[Answer]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)

    def route(self, method: str, path: str, *answers: Answer) -> None:
        self.routes[(method, path)] = list(answers)

    def asked(self, method: str, path: str) -> int:
        return self.seen.count((method, path))

    def next_answer(self, method: str, path: str) -> Answer:
        self.seen.append((method, path))
        queue = self.routes.get((method, path))
        if not queue:
            return Answer(404, "Not Found", [("Content-Type", "text/plain")], b"no route\n")
        return queue.pop(0) if len(queue) > 1 else queue[0]


def _handler(replay: Replay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            ans = replay.next_answer(self.command, urlsplit(self.path).path)
            self.send_response(ans.status, ans.reason)
            for name, value in ans.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(ans.body)))
            self.end_headers()
            self.wfile.write(ans.body)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


@pytest.fixture
def replay() -> Iterator[Replay]:
    r = Replay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(r))
    r.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield r
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def refused() -> Iterator[str]:
    """A loopback URL that refuses connections: the port is bound, nobody listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def workflow_sees(e: BaseException) -> tuple[str, bool]:
    """(type, non_retryable) of the failure a workflow gets when an activity raises `e`."""
    failure = Failure()
    dc = DataConverter.default
    dc.failure_converter.to_failure(e, dc.payload_converter, failure)
    info = failure.application_failure_info
    return info.type, info.non_retryable


def assert_outage(e: BaseException, type_name: str, component: str) -> None:
    seen_type, non_retryable = workflow_sees(e)
    assert seen_type == type_name and is_unavailable_type(seen_type), seen_type
    assert not non_retryable
    assert str(e).startswith(f"{component} unavailable: "), str(e)


# --- Prometheus --------------------------------------------------------------------------------

QUERY = "/api/v1/query"
QUERY_RANGE = "/api/v1/query_range"
PROMETHEUS_FAILURES = [
    # (document, status, what its message says)
    ("prometheus_not_ready", 503, "Service Unavailable"),
    ("prometheus_query_range_timeout", 503, "timeout: query timed out in expression evaluation"),
    ("prometheus_query_execution_error", 422, "execution: query processing would load too many"),
    ("prometheus_query_bad_data", 400, "bad_data: invalid parameter"),
]


async def test_prometheus_answers_are_a_figure_or_no_data(replay: Replay) -> None:
    replay.route(
        "GET", QUERY, captured("prometheus_query_vector"), captured("prometheus_query_empty")
    )
    async with httpx.AsyncClient() as http:
        assert await prometheus_value(http, replay.url, "vector(0.75)") == 0.75
        # An empty result in a success envelope: no series matched, an answer.
        assert await prometheus_value(http, replay.url, "DCGM_FI_DEV_GPU_UTIL") is None


@pytest.mark.parametrize(("name", "status", "says"), PROMETHEUS_FAILURES)
async def test_a_failed_prometheus_query_is_unavailable_not_no_data(
    replay: Replay, name: str, status: int, says: str
) -> None:
    replay.route("GET", QUERY, captured(name))
    async with httpx.AsyncClient() as http:
        with pytest.raises(PrometheusUnavailable) as err:
            await prometheus_value(http, replay.url, "inference_demand")
    assert err.value.status == status and says in str(err.value)
    assert isinstance(err.value, Unavailable) and err.value.component == "Prometheus"
    assert_outage(err.value, "PrometheusUnavailable", "Prometheus")


async def test_prometheus_refused_or_garbled_is_unavailable(replay: Replay, refused: str) -> None:
    whole = captured("prometheus_query_vector")
    replay.route("GET", QUERY, Answer(200, "OK", whole.headers, whole.body[:-9]))  # cut short
    async with httpx.AsyncClient() as http:
        with pytest.raises(PrometheusUnavailable, match="not the API's JSON"):
            await prometheus_value(http, replay.url, "q")
        with pytest.raises(PrometheusUnavailable, match="ConnectError") as err:
            await prometheus_value(http, refused, "q")
    assert_outage(err.value, "PrometheusUnavailable", "Prometheus")


async def test_the_demand_read_fails_as_an_outage_rather_than_deciding_from_nothing(
    replay: Replay,
) -> None:
    """Before: an unanswered query was `None`, indistinguishable from "no data"; now the
    evaluation fails with PrometheusUnavailable and no Demand is made from it."""
    replay.route("GET", QUERY, captured("prometheus_query_range_timeout"))
    slurm = FakeSlurm()
    async with httpx.AsyncClient() as http:
        acts = ShareDemandActivities(slurm, http, prometheus_url=replay.url)
        with pytest.raises(PrometheusUnavailable) as err:
            await ActivityEnvironment().run(
                acts.read_demand, DemandCall(cluster="c", policy=SharePolicy())
            )
    assert "query timed out" in str(err.value)
    assert_outage(err.value, "PrometheusUnavailable", "Prometheus")


@pytest.mark.parametrize("name", ["prometheus_query_range_timeout", "prometheus_not_ready"])
async def test_the_console_says_prometheus_is_unavailable_not_empty_charts(
    replay: Replay, name: str
) -> None:
    replay.route("GET", QUERY_RANGE, captured(name))
    async with httpx.AsyncClient() as http:
        got = await console_prometheus.node_metrics(http, replay.url, NODE, now=1700003600)
    assert got.configured and got.charts == []
    assert got.error is not None and got.error.startswith("Prometheus unavailable: ")


async def test_the_console_tells_refused_from_no_series(replay: Replay, refused: str) -> None:
    async with httpx.AsyncClient() as http:
        down = await console_prometheus.node_metrics(http, refused, NODE)
        replay.route("GET", QUERY_RANGE, captured("prometheus_query_range_empty"))
        empty = await console_prometheus.node_metrics(http, replay.url, NODE)
    assert down.error is not None and down.error.startswith("Prometheus unavailable: ")
    assert empty.error is None and empty.charts == []  # the page says "no GPU series"


# --- Kubernetes --------------------------------------------------------------------------------

NODE_PATH = f"/api/v1/nodes/{NODE}"
PODS_PATH = "/api/v1/pods"
EVICTION_PATH = "/api/v1/namespaces/default/pods/web-0/eviction"
KUBERNETES_OUTAGES = [
    ("kubernetes_503_shutting_down", "503 apiserver is shutting down"),
    ("kubernetes_429_overloaded", "429 Too many requests, please try again later."),
    ("kubernetes_504_timeout", "504 Timeout: request did not complete within requested timeout"),
]


def kube_api(url: str) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    cfg.host = url
    return k8s.ApiClient(cfg)


def node_doc(boot_id: str = "boot-1", ready: bool = True) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": NODE, "uid": "uid-1", "resourceVersion": "7"},
        "spec": {"providerID": "crusoe://vm-1"},
        "status": {
            "nodeInfo": {"bootID": boot_id},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod_list() -> dict[str, Any]:
    pod = {
        "metadata": {"name": "web-0", "namespace": "default", "uid": "pod-uid-1"},
        "spec": {"nodeName": NODE},
        "status": {"phase": "Running"},
    }
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [pod]}


class RetryAfterWaits(list[float]):
    """The waits urllib3 (under the kubernetes client) takes for a `Retry-After`, recorded
    instead of slept: the test checks that the client honoured each one, without spending
    a second on each."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)  # urllib3's retry module reads nothing else of `time`

    def sleep(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def retry_after_waits(monkeypatch: pytest.MonkeyPatch) -> RetryAfterWaits:
    waits = RetryAfterWaits()
    monkeypatch.setattr(urllib3.util.retry, "time", waits)
    return waits


@pytest.fixture
def kube(replay: Replay) -> Iterator[KubernetesActivities]:
    with kube_api(replay.url) as api:
        yield KubernetesActivities(api, request_timeout_s=5)


@pytest.mark.parametrize(("name", "says"), KUBERNETES_OUTAGES)
async def test_a_kubernetes_outage_is_unavailable(
    replay: Replay,
    kube: KubernetesActivities,
    retry_after_waits: RetryAfterWaits,
    name: str,
    says: str,
) -> None:
    """Before: 5xx were `KubernetesRetryable` and 429 the same; now all three are an outage.
    The 503 and 429 carry `Retry-After: 1`: the client honours it three times first."""
    replay.route("GET", NODE_PATH, captured(name))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(kube.node_identity, NodeIdentityInput(node=NODE))
    assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable
    assert err.value.message.startswith(f"Kubernetes API unavailable: {says}")
    honoured = [] if name.endswith("504_timeout") else [1.0, 1.0, 1.0]
    assert retry_after_waits == honoured
    assert replay.asked("GET", NODE_PATH) == 1 + len(honoured)


async def test_kubernetes_refused_is_unavailable_not_raw(refused: str) -> None:
    """Before: urllib3's MaxRetryError left the activity as it was (type MaxRetryError)."""
    with kube_api(refused) as api:
        acts = KubernetesActivities(api, request_timeout_s=5)
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(acts.node_identity, NodeIdentityInput(node=NODE))
    assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable
    assert "MaxRetryError" in str(err.value)


async def test_a_conflict_stays_a_retryable_conflict(
    replay: Replay, kube: KubernetesActivities
) -> None:
    replay.route("GET", NODE_PATH, answer_json(node_doc()))
    replay.route("PATCH", NODE_PATH, captured("kubernetes_409_conflict"))
    inp = CordonNodeInput(node=NODE, incident_id="inc-1", reason="XID_79", phase="quarantine")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(kube.cordon_node, inp)
    assert err.value.type == "KubernetesRetryable" and not err.value.non_retryable
    assert replay.asked("PATCH", NODE_PATH) == 5  # re-read and re-planned each time


async def test_an_unanswered_pod_list_is_not_an_empty_node(
    replay: Replay, kube: KubernetesActivities
) -> None:
    """A drain that read "no pods" from a failed list would call the node empty."""
    replay.route("GET", NODE_PATH, answer_json(node_doc()))
    replay.route("GET", PODS_PATH, captured("kubernetes_504_timeout"))
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as err:
        await env.run(kube.evict_pods, EvictPodsInput(node=NODE, timeout_s=1))
    assert err.value.type == "KubernetesUnavailable"
    # A 200 that is not a list (no `items`: a proxy's answer) is no answer either.
    replay.route("GET", PODS_PATH, answer_json({"kind": "Status", "status": "Success"}))
    with pytest.raises(ApplicationError) as err:
        await env.run(kube.evict_pods, EvictPodsInput(node=NODE, timeout_s=1))
    assert err.value.type == "KubernetesUnavailable" and "without items" in str(err.value)


async def test_an_overloaded_eviction_is_an_outage_a_budget_is_a_refusal(
    replay: Replay, kube: KubernetesActivities
) -> None:
    """Both are 429: the eviction API's refusal is a Status document, the API server's
    overload answer plain text."""
    replay.route("GET", NODE_PATH, answer_json(node_doc()))
    replay.route("GET", PODS_PATH, answer_json(pod_list()))
    replay.route("POST", EVICTION_PATH, captured("kubernetes_429_overloaded"))
    env = ActivityEnvironment()
    inp = EvictPodsInput(node=NODE, timeout_s=0.3, poll_s=0.05, max_backoff_s=0.05)
    with pytest.raises(ApplicationError) as err:
        await env.run(kube.evict_pods, inp)
    assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable

    replay.route("POST", EVICTION_PATH, captured("kubernetes_429_disruption_budget"))
    with pytest.raises(ApplicationError) as err:
        await env.run(kube.evict_pods, inp)
    assert err.value.type == "EvictionBlocked" and err.value.non_retryable
    assert "The disruption budget web needs 1 healthy pods" in str(err.value)


async def test_waiting_for_the_new_node_rides_an_outage_out_and_says_so(
    replay: Replay, kube: KubernetesActivities, retry_after_waits: RetryAfterWaits
) -> None:
    """The 503 and 429 carry `Retry-After: 1`, which the kubernetes client (urllib3) honours
    itself, three times at most, before the activity sees anything; the 504 does not."""
    replay.route(
        "GET",
        NODE_PATH,
        captured("kubernetes_504_timeout"),
        captured("kubernetes_503_shutting_down"),
        captured("kubernetes_429_overloaded"),
        answer_json(node_doc(boot_id="boot-2")),
    )
    env = ActivityEnvironment()
    beats: list[Any] = []
    env.on_heartbeat = lambda *details: beats.extend(details)
    inp = WaitNewNodeInput(node=NODE, old_provider_id="", old_boot_id="boot-1", poll_s=0.01)
    assert (await env.run(kube.wait_new_node_ready, inp)).boot_id == "boot-2"
    assert replay.asked("GET", NODE_PATH) == 4
    assert retry_after_waits == [1.0, 1.0]  # the 503's and the 429's, inside the client
    said = [b for b in beats if isinstance(b, str)]
    assert (
        "Kubernetes API unavailable: 504 Timeout: request did not complete within requested "
        "timeout - context deadline exceeded"
    ) in said
    assert "not registered" not in said  # unknown was never reported as absent


async def test_the_demand_read_fails_on_a_kubernetes_outage(replay: Replay) -> None:
    replay.route("GET", QUERY, captured("prometheus_query_vector"))
    replay.route("GET", "/api/v1/nodes", captured("kubernetes_504_timeout"))
    async with httpx.AsyncClient() as http:
        with kube_api(replay.url) as api:
            acts = ShareDemandActivities(FakeSlurm(), http, prometheus_url=replay.url, kube=api)
            with pytest.raises(ApplicationError) as err:
                await ActivityEnvironment().run(
                    acts.read_demand, DemandCall(cluster="c", policy=SharePolicy())
                )
    assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable


def _cmk(api: k8s.ApiClient) -> CmkProvider:
    # inventory reads Kubernetes first: the Crusoe client and Slurm are never reached.
    return CmkProvider(
        cast(Any, None), KubeObjects(api, "slurm", timeout_s=5), cast(Any, None), cmk_cluster_id="k"
    )


async def test_a_cmk_read_of_kubernetes_fails_as_an_outage(replay: Replay, refused: str) -> None:
    path = f"/apis/{CONTROLLER.group}/{CONTROLLER.version}/namespaces/slurm/controllers/c1"
    replay.route("GET", path, captured("kubernetes_504_timeout"))
    ref = ClusterRef(name="c1", provider="crusoe-cmk", location="us-east1-a")
    for url in (replay.url, refused):
        with kube_api(url) as api:
            with pytest.raises(ApplicationError) as err:
                await ActivityEnvironment().run(_cmk(api).inventory, ref)
        assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable


async def test_the_console_shows_kubernetes_unknown_not_absent(
    replay: Replay, refused: str, tmp_path: Path
) -> None:
    for url in (replay.url, refused):
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": url}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        settings = cast(Any, SimpleNamespace(kubernetes=SimpleNamespace(kubeconfig=kubeconfig)))
        source = LiveSource(settings, cast(Any, None), cast(Any, None), timeout_s=30)
        replay.route("GET", NODE_PATH, captured("kubernetes_504_timeout"))
        with pytest.raises(KubernetesUnavailable):
            await source.kubernetes_node(NODE)
    # A refusal is an answer the page shows as it is.
    replay.route("GET", NODE_PATH, answer_json({"kind": "Status", "code": 404}, status=404))
    kubeconfig.write_text(kubeconfig.read_text().replace(refused, replay.url))
    assert await source.kubernetes_node(NODE) == {"error": "404 Not Found"}


# --- the Crusoe API ------------------------------------------------------------------------------

PROJECT = "p"
VMS = f"/v1/projects/{PROJECT}/compute/vms/instances"


@pytest_asyncio.fixture
async def crusoe(replay: Replay) -> AsyncIterator[CrusoeClient]:
    async with _crusoe(replay.url) as c:
        yield c


def _crusoe(url: str) -> CrusoeClient:
    creds = CrusoeCredentials(
        access_key_id="ak",
        secret_key=SecretStr("c2VjcmV0"),
        api_endpoint=f"{url}/v1",
        default_project=PROJECT,
    )
    return CrusoeClient(
        credentials=creds, max_attempts=3, backoff_s=0.01, max_backoff_s=0.02, poll_s=0.01
    )


async def test_every_crusoe_read_raises_unavailable_on_the_api_503(
    replay: Replay, crusoe: CrusoeClient
) -> None:
    outage = captured("crusoe_emulator_503")
    replay.route("GET", VMS, outage)
    replay.route("GET", f"{VMS}/vm-1", outage)
    replay.route("GET", f"{VMS}/operations/op-1", outage)
    reads = [
        crusoe.list_vms(),
        crusoe.find_vm_by_name(NODE),
        crusoe.get_vm("vm-1"),
        crusoe.wait_operation(Operation(operation_id="op-1"), "vm"),
    ]
    for read in reads:
        with pytest.raises(CrusoeUnavailable) as err:
            await read
        assert err.value.status == 503 and "injected fault" in str(err.value)
        assert_outage(err.value, "CrusoeUnavailable", "Crusoe API")
    assert replay.asked("GET", f"{VMS}/vm-1") == 3  # retried, then given up


async def test_a_crusoe_answer_that_is_not_one_is_unavailable(
    replay: Replay, crusoe: CrusoeClient, refused: str
) -> None:
    html = Answer(200, "OK", [("Content-Type", "text/html")], b"<html>502 Bad Gateway</html>")
    replay.route("GET", f"{VMS}/vm-1", html)
    with pytest.raises(CrusoeUnavailable, match="not JSON"):
        await crusoe.get_vm("vm-1")
    replay.route("GET", f"{VMS}/vm-2", Answer(200, "OK", [], b""))
    with pytest.raises(CrusoeUnavailable, match="no body"):
        await crusoe.get_vm("vm-2")
    # An error envelope with a 200 is no list; `{}` is an empty one.
    replay.route("GET", VMS, answer_json(document("crusoe_emulator_503")), answer_json({}))
    with pytest.raises(CrusoeUnavailable, match="not a list"):
        await crusoe.list_vms()
    assert await crusoe.list_vms() == []
    async with _crusoe(refused) as down:
        with pytest.raises(CrusoeUnavailable, match="ConnectError"):
            await down.list_vms()


async def test_the_repair_plan_reaches_the_workflow_as_a_crusoe_outage(
    replay: Replay, crusoe: CrusoeClient
) -> None:
    """Before: `CloudError`, which the workflow cannot tell from a refused repair."""
    replay.route("GET", VMS, captured("crusoe_emulator_503"))
    acts = CloudActivities(CrusoeCloud(crusoe, poll_s=0.01))
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            acts.plan_repair, PlanRepairInput(node=NODE, rung=Rung.REPLACE, key="inc-1")
        )
    assert err.value.type == "CrusoeUnavailable" and not err.value.non_retryable
    assert err.value.message.startswith("Crusoe API unavailable: GET ")


def test_the_documents_are_what_the_readers_are_tested_against() -> None:
    """Every checked-in document is used, and its JSON ones parse."""
    used = {
        *(n for n, _, _ in PROMETHEUS_FAILURES),
        *(n for n, _ in KUBERNETES_OUTAGES),
        "prometheus_query_vector",
        "prometheus_query_empty",
        "prometheus_query_range_empty",
        "kubernetes_409_conflict",
        "kubernetes_429_disruption_budget",
        "crusoe_emulator_503",
    }
    assert {p.stem for p in OUTAGES.glob("*.http")} == used
    for name in used:
        ans = captured(name)
        if ("Content-Type", "application/json") in ans.headers:
            assert isinstance(json.loads(ans.body), dict)
