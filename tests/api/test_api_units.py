"""The API's parts without servers: Alertmanager mapping (node and fault from labels),
the dedupe store, bearer auth, the node inventories, the settings' fault table, and the
shipped Prometheus rules and Alertmanager receiver (parsed: no Prometheus runs here).

The HTTP behaviour itself is in test_api.py.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from autoclusters.clients.api.alertmanager import (
    AlertmanagerPayload,
    FaultMap,
    fingerprint_of,
    node_candidates,
    read_alerts,
)
from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.inventory import SlurmInventory, StaticInventory
from autoclusters.clients.web.auth import BearerAuth, Caller, Unauthorized
from autoclusters.clients.web.settings import DEFAULT_ALERT_FAULTS, ApiSettings
from autoclusters.core.faults import FAULT_PATTERN
from autoclusters.core.policy import Rung, default_policy
from tests.fakes.systems import FakeSlurm

ROOT = Path(__file__).resolve().parents[2]
FAULTS = FaultMap(DEFAULT_ALERT_FAULTS)


# --- Alertmanager ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        ({"Hostname": "gpu-01", "instance": "10.0.0.7:9400"}, ["gpu-01"]),
        ({"hostname": "gpu-01"}, ["gpu-01"]),
        ({"node": "gpu-01"}, ["gpu-01"]),
        ({"kubernetes_node": "gpu-01"}, ["gpu-01"]),
        # Exporters often report FQDNs where Slurm knows short names: both, FQDN first.
        ({"Hostname": "gpu-01.dc1.example.com"}, ["gpu-01.dc1.example.com", "gpu-01"]),
        # Hostname wins over node (dcgm-exporter's own label over a relabelled one).
        ({"Hostname": "gpu-01", "node": "gpu-02"}, ["gpu-01"]),
        # instance only as a last resort, and only when it names a host, not an address.
        ({"instance": "gpu-07:9100"}, ["gpu-07"]),
        ({"instance": "10.0.0.7:9400"}, []),
        ({"instance": "[fd00::7]:9400"}, []),
        ({"Hostname": ""}, []),
        ({"Hostname": "not a node"}, []),
        ({}, []),
    ],
)
def test_node_comes_from_the_node_labels_and_instance_only_as_a_last_resort(
    labels: dict[str, str], want: list[str]
) -> None:
    assert node_candidates(labels) == want


@pytest.mark.parametrize(
    ("labels", "fault"),
    [
        ({"alertname": "GpuXidError", "xid": "79"}, "XID_79"),
        ({"alertname": "GpuXidError", "err_code": "48"}, "XID_48"),  # newer dcgm-exporter
        ({"alertname": "GpuXidError", "xid": "079"}, "XID_79"),
        ({"alertname": "GPUXidFatal", "xid": "95"}, "XID_95"),
        ({"alertname": "gpuxiderror", "xid": "13"}, "XID_13"),  # names match in any case
        ({"alertname": "GpuRowRemapFailure"}, "ROW_REMAP_FAILURE"),
        ({"alertname": "GpuDoubleBitEcc"}, "ECC_DBE"),
        ({"alertname": "GpuMissing"}, "GPU_COUNT_LOW"),
        ({"alertname": "InfinibandLinkDown"}, "IB_LINK_DOWN"),
        # Our rules name the fault outright: the label wins over the alertname.
        (
            {"alertname": "GpuXidError", "xid": "79", "fault": "GPU_FELL_OFF_BUS"},
            "GPU_FELL_OFF_BUS",
        ),
        ({"alertname": "Anything", "fault": "XID_64"}, "XID_64"),
    ],
)
def test_fault_from_label_or_alertname(labels: dict[str, str], fault: str) -> None:
    assert FAULTS.fault_for(labels)[0] == fault


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"alertname": "DiskFull"}, "unmapped"),
        ({"alertname": "DiskFull", "fault": "disk"}, "unmapped"),  # not a fault kind
        ({"alertname": "GpuXidError"}, "bad_fault"),  # no xid label
        ({"alertname": "GpuXidError", "xid": "lots"}, "bad_fault"),
        ({"alertname": "GpuXidError", "xid": "1234"}, "bad_fault"),
    ],
)
def test_alerts_that_name_no_fault_are_skipped_with_a_reason(
    labels: dict[str, str], reason: str
) -> None:
    fault, why, detail = FAULTS.fault_for(labels)
    assert fault is None and why == reason and detail


def test_configured_alertnames_extend_and_override_the_defaults() -> None:
    s = ApiSettings(api_alert_faults={"MyGpuGone": "GPU_FELL_OFF_BUS", "GpuMissing": ""})
    faults = FaultMap(s.alert_faults())
    assert faults.fault_for({"alertname": "MyGpuGone"})[0] == "GPU_FELL_OFF_BUS"
    assert faults.fault_for({"alertname": "GpuMissing"})[1] == "unmapped"  # "" turns it off
    assert faults.fault_for({"alertname": "GpuRowRemapFailure"})[0] == "ROW_REMAP_FAILURE"
    with pytest.raises(ValidationError, match="not a fault kind"):
        ApiSettings(api_alert_faults={"Bad": "gpu gone"})


def test_every_default_alertname_maps_to_a_fault_the_default_policy_knows() -> None:
    policy = default_policy()
    for name, template in DEFAULT_ALERT_FAULTS.items():
        fault = template.replace("{xid}", "79")
        assert FAULT_PATTERN.match(fault), name
        assert fault in policy.faults, f"{name} -> {fault} is not in the default policy"


def test_payload_parser_tolerates_what_alertmanager_sends_in_the_wild() -> None:
    body = {
        "version": "4",
        "groupKey": '{}:{alertname="GpuXidError"}' + "k" * 2000,
        "status": "firing",
        "receiver": "autoclusters",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am:9093",
        "truncatedAlerts": 0,
        "notification_reason": "new_alerts",  # newer Alertmanager
        "routeLabels": {"x": "y"},
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "GpuXidError", "xid": "79", "Hostname": "gpu-01"},
                "annotations": {},
                "startsAt": "2026-05-01T10:00:00.123456789Z",  # Go's nanoseconds
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": "1a30ba71cca2921f",
                "silencedBy": [],  # unknown to us
            },
            {  # an Alertmanager older than 0.19: no fingerprint
                "status": "resolved",
                "labels": {"alertname": "GpuMissing", "node": "gpu-02"},
                "startsAt": "2026-05-01T10:00:00+02:00",
                "endsAt": "2026-05-01T10:05:00+02:00",
            },
        ],
    }
    payload = AlertmanagerPayload.model_validate(body)
    read = read_alerts(payload, FAULTS)
    assert [(m.fault, m.node_candidates, m.alert.status) for m in read.mapped] == [
        ("XID_79", ["gpu-01"], "firing"),
        ("GPU_COUNT_LOW", ["gpu-02"], "resolved"),
    ]
    assert read.mapped[0].key.startswith("am:1a30ba71cca2921f:2026-05-01T10:00:00.123456")
    labels = body["alerts"][1]["labels"]  # type: ignore[index]
    assert read.mapped[1].fingerprint == fingerprint_of(labels)
    # Retries and re-sends give the same key; the resolution of an alert is a new event.
    again = read_alerts(AlertmanagerPayload.model_validate(body), FAULTS)
    assert [m.key for m in again.mapped] == [m.key for m in read.mapped]
    assert read.mapped[0].key != read.mapped[0].key.replace(":firing", ":resolved")


# --- dedupe -------------------------------------------------------------------------------------


async def test_dedupe_store_repeats_wait_for_the_first_and_failures_are_forgotten() -> None:
    store: DedupeStore[str] = DedupeStore(ttl_s=60, max_entries=100)
    first = store.claim("a")
    repeat = store.claim("a")
    assert first.new and not repeat.new and repeat.future is first.future
    store.settle("a", first.future, "inc-1")
    assert await repeat.future == "inc-1"
    assert not store.claim("a").new

    failing = store.claim("b")
    store.fail("b", failing.future, RuntimeError("down"))
    retry = store.claim("b")
    assert retry.new, "a failed delivery must be delivered again on retry"


async def test_dedupe_store_is_bounded_and_expires() -> None:
    store: DedupeStore[str] = DedupeStore(ttl_s=0.05, max_entries=3)
    for k in "abcd":
        c = store.claim(k)
        store.settle(k, c.future, k)
    assert len(store) == 3 and store.claim("a").new  # the oldest went first
    await asyncio.sleep(0.1)
    assert store.claim("b").new  # expired


# --- auth ---------------------------------------------------------------------------------------


def test_bearer_auth_names_the_caller_and_refuses_the_rest() -> None:
    auth = BearerAuth(
        ApiSettings(
            api_tokens={"alertmanager": "s3cret-0123456789", "agents": {
                "role": "agent", "token": "other-0123456789a"}}
        )
    )  # fmt: skip
    assert auth.caller("Bearer s3cret-0123456789") == Caller("alertmanager", "alertmanager")
    assert auth.caller("bearer other-0123456789a") == Caller("agents", "agent")
    for header in (None, "", "Bearer", "Bearer wrong", "Basic s3cret-0123456789", "s3cret"):
        with pytest.raises(Unauthorized):
            auth.caller(header)
    with pytest.raises(Unauthorized, match="no API tokens"):
        BearerAuth(ApiSettings(api_tokens={})).caller("Bearer s3cret-0123456789")


# --- inventories --------------------------------------------------------------------------------


async def test_static_inventory_expands_hostlists() -> None:
    inv = StaticInventory(["gpu-[001-004]", "login-1"])
    assert await inv.known({"gpu-002", "gpu-005", "login-1"}) == {"gpu-002", "login-1"}


async def test_slurm_inventory_caches_and_refreshes_for_a_node_it_does_not_know() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    inv = SlurmInventory(slurm, ttl_s=300)
    assert await inv.known({"gpu-01", "gpu-02"}) == {"gpu-01"}
    calls = slurm.calls["nodes"]
    assert await inv.known({"gpu-01"}) == {"gpu-01"}
    assert slurm.calls["nodes"] == calls  # cached
    slurm.add_node("gpu-02")
    await asyncio.sleep(1.05)  # a miss refreshes at most once a second
    assert await inv.known({"gpu-02"}) == {"gpu-02"}


# --- shipped configuration ----------------------------------------------------------------------


def test_prometheus_rules_name_faults_the_api_and_the_policy_understand() -> None:
    doc = yaml.safe_load((ROOT / "deploy/prometheus/gpu-alerts.yml").read_text())
    # The sharing group's rule asks GPU sharing to evaluate; it names no fault (below).
    rules = [r for g in doc["groups"] if g["name"] != "autoclusters-sharing" for r in g["rules"]]
    policy = default_policy()
    names = {r["alert"] for r in rules}
    assert {"GpuXidError", "GpuRowRemapFailure", "GpuDoubleBitEcc", "GpuMissing",
            "InfinibandLinkDown"} <= names  # fmt: skip
    for rule in rules:
        labels = rule["labels"]
        assert labels["autoclusters"] == "remediate" and labels["severity"]
        fault = labels["fault"]
        if "{{" in fault:  # XID_{{ $labels.xid }}: every Xid the rule selects
            xids = re.search(r'xid=~"([\d|]+)"', rule["expr"])
            assert xids, rule["alert"]
            faults = [f"XID_{x}" for x in xids.group(1).split("|")]
        else:
            faults = [fault]
        for f in faults:
            assert FAULT_PATTERN.match(f) and f in policy.faults, (rule["alert"], f)
            # Alerts are for faults that need a repair, not for watching.
            assert policy.rule_for(f).first_rung != Rung.MONITOR, (rule["alert"], f)
        # The alertname alone maps to the same fault (a relabel that drops `fault`).
        assert FAULTS.fault_for({"alertname": rule["alert"], "xid": "79"})[0] is not None


def test_the_inference_slo_alert_reaches_the_sharing_webhook_with_the_policys_slo() -> None:
    from autoclusters.core.sharing import SharePolicy

    rules = yaml.safe_load((ROOT / "deploy/prometheus/gpu-alerts.yml").read_text())
    group = next(g for g in rules["groups"] if g["name"] == "autoclusters-sharing")
    (rule,) = group["rules"]
    assert rule["labels"]["autoclusters"] == "share" and "fault" not in rule["labels"]
    # The rule fires on what the sharing workflow decides from: the default demand query, above
    # the default SLO.
    policy = SharePolicy()
    assert rule["expr"].strip() == f"{policy.inference.demand_query} > {policy.inference.slo:g}"
    doc = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    route = next(r for r in doc["route"]["routes"] if r["receiver"] == "autoclusters-sharing")
    assert route["matchers"] == ['autoclusters = "share"']
    receiver = next(r for r in doc["receivers"] if r["name"] == "autoclusters-sharing")
    (hook,) = receiver["webhook_configs"]
    assert hook["url"].endswith("/v1/alerts/sharing")
    assert hook["http_config"]["authorization"]["credentials_file"]


def test_alertmanager_receiver_posts_to_the_api_with_a_bearer_token() -> None:
    doc = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    route = next(r for r in doc["route"]["routes"] if r["receiver"] == "autoclusters")
    assert route["matchers"] == ['autoclusters = "remediate"']
    receiver = next(r for r in doc["receivers"] if r["name"] == "autoclusters")
    (hook,) = receiver["webhook_configs"]
    assert hook["url"].endswith("/v1/alerts/alertmanager")
    assert hook["send_resolved"] is True
    auth = hook["http_config"]["authorization"]
    assert auth["type"] == "Bearer" and auth["credentials_file"]
