"""Alertmanager's webhook (payload version "4"), and what each alert means for us: a node
and a fault kind, or a reason it is not ours to act on.

Tolerant where Alertmanager varies (unknown fields, endsAt 0001-01-01 on firing alerts,
group keys of any length), strict where we act on it (status, labels, startsAt).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property, lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoclusters.core.fault_evidence import utc
from autoclusters.core.faults import FAULT_PATTERN, NODE_PATTERN

# Where dcgm-exporter and kube-prometheus put the node: `Hostname` (dcgm-exporter, renamed
# `hostname` in newer releases), `node` / `kubernetes_node` (relabelled from the pod's
# node). `instance` is often the exporter pod's address: only a last resort.
NODE_LABELS = ("Hostname", "hostname", "node", "kubernetes_node")
# A label that names the fault kind outright (our rules set it); wins over the alertname.
FAULT_LABEL = "fault"
# Labels a `{name}` in a fault template may be filled from, in order.
TEMPLATE_LABELS = {"xid": ("xid", "err_code")}

AlertStatus = Literal["firing", "resolved"]


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime = Field(alias="startsAt")
    # Firing alerts carry 0001-01-01T00:00:00Z: a valid (if odd) datetime.
    ends_at: datetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    # Old Alertmanagers (< 0.19) sent none: computed from the labels as Alertmanager does.
    fingerprint: str = ""


class AlertmanagerPayload(BaseModel):
    """The webhook body. Newer fields (notification_reason, routeLabels, ...) are kept."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    version: Literal["4"]
    group_key: str = Field(default="", alias="groupKey")  # may exceed 1,000 bytes: never an id
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts")
    status: AlertStatus
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[Alert]


SkipReason = Literal["unmapped", "no_node", "bad_fault", "unknown_node"]


@dataclass
class MappedAlert:
    """An alert we act on: its node candidates (first known one wins) and fault kind."""

    index: int
    alert: Alert
    fingerprint: str
    fault: str
    node_candidates: list[str]
    node: str = ""  # set once the inventory picked a candidate

    @property
    def alertname(self) -> str:
        return self.alert.labels.get("alertname", "")

    @cached_property  # asked for twice per alert: its signal's key, its evidence's
    def key(self) -> str:
        """Alertmanager re-sends and retries an alert with the same fingerprint and
        startsAt; its resolution is a separate event."""
        at = utc(self.alert.starts_at).isoformat()  # `+09:00` and `Z`: one instant
        return f"am:{self.fingerprint}:{at}:{self.alert.status}"


@dataclass
class SkippedAlert:
    index: int
    fingerprint: str
    alertname: str
    reason: SkipReason
    detail: str
    node: str = ""


@dataclass
class ReadAlerts:
    mapped: list[MappedAlert] = field(default_factory=list)
    skipped: list[SkippedAlert] = field(default_factory=list)


class FaultMap:
    """alertname -> fault kind; templates such as XID_{xid} are filled from labels."""

    def __init__(self, by_alertname: dict[str, str]) -> None:
        self._by_name = {k.casefold(): v for k, v in by_alertname.items()}

    def fault_for(self, labels: dict[str, str]) -> tuple[str | None, SkipReason, str]:
        """The fault kind, or None with the reason and its detail."""
        explicit = labels.get(FAULT_LABEL, "")
        if FAULT_PATTERN.match(explicit):
            return explicit, "unmapped", ""
        name = labels.get("alertname", "")
        template = self._by_name.get(name.casefold())
        if not template:
            return None, "unmapped", f"alertname {name!r} maps to no fault kind"
        fault = _fill(template, labels)
        if fault is None or not FAULT_PATTERN.match(fault):
            need = ", ".join(_fields(template))
            return None, "bad_fault", f"alertname {name!r} ({template}) needs a numeric {need}"
        return fault, "unmapped", ""


@lru_cache(maxsize=1024)  # a handful of templates, read for every alert of a storm
def _fields(template: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\{(\w+)\}", template))


def _fill(template: str, labels: dict[str, str]) -> str | None:
    values: dict[str, str] = {}
    for name in _fields(template):
        value = next((labels[k] for k in TEMPLATE_LABELS.get(name, (name,)) if labels.get(k)), "")
        if not value.isdigit():
            return None
        values[name] = str(int(value))
    return template.format(**values)


def node_candidates(labels: dict[str, str]) -> list[str]:
    """Names the alert may mean, best first: the label's value, then its short host name
    (exporters often report FQDNs where Slurm knows short names)."""
    raw = next((labels[k] for k in NODE_LABELS if labels.get(k)), "")
    if not raw and labels.get("instance"):
        raw = _host_part(labels["instance"])
        if _is_ip(raw):  # an exporter's pod or node IP says nothing about the Slurm name
            raw = ""
    if not raw:
        return []
    names = [raw]
    if "." in raw and not _is_ip(raw):
        names.append(raw.split(".", 1)[0])
    return [n for n in names if NODE_PATTERN.match(n)]


def _host_part(instance: str) -> str:
    if instance.startswith("["):  # [v6]:port
        return instance[1:].split("]", 1)[0]
    host, _, port = instance.rpartition(":")
    return host if host and port.isdigit() else instance


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def fingerprint_of(labels: dict[str, str]) -> str:
    blob = json.dumps(sorted(labels.items()), separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def read_alerts(payload: AlertmanagerPayload, faults: FaultMap) -> ReadAlerts:
    out = ReadAlerts()
    for i, alert in enumerate(payload.alerts):
        fp = alert.fingerprint or fingerprint_of(alert.labels)
        name = alert.labels.get("alertname", "")
        fault, reason, why = faults.fault_for(alert.labels)
        if fault is None:
            out.skipped.append(SkippedAlert(i, fp, name, reason, why))
            continue
        nodes = node_candidates(alert.labels)
        if not nodes:
            out.skipped.append(
                SkippedAlert(
                    i,
                    fp,
                    name,
                    "no_node",
                    f"no node label ({', '.join(NODE_LABELS)}) nor a host name in instance",
                )  # fmt: skip
            )
            continue
        out.mapped.append(MappedAlert(i, alert, fp, fault, nodes))
    return out
