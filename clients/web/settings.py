"""The API's settings: the shared ones plus what only the HTTP API needs (AUTOCLUSTERS_API_*).

Kept in a subclass so the worker and the CLI never see them; `autoclusters.toml` and the
environment fill them as they fill the rest. Here, below the API and the console, because
the console served beside the API reads them too (its address, tokens, Temporal timeout).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from autoclusters.clients.web.tokens import Role, TokenGrant, parse_grants
from autoclusters.core.faults import FAULT_PATTERN
from autoclusters.core.settings import Settings

# Alertmanager alertname -> fault kind. `{xid}` is filled from the alert's `xid` label
# (dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT), or `err_code` (DCGM_FI_DEV_XID_ERRORS on
# newer exporters). The rules in deploy/prometheus/gpu-alerts.yml use these names, and
# also carry a `fault` label, which wins over this table.
DEFAULT_ALERT_FAULTS: dict[str, str] = {
    "GpuXidError": "XID_{xid}",
    "GPUXidFatal": "XID_{xid}",  # the name in our reference rules
    "GpuFellOffBus": "GPU_FELL_OFF_BUS",
    "GpuRowRemapFailure": "ROW_REMAP_FAILURE",
    "GpuRowRemapPending": "ROW_REMAP_PENDING",
    "GpuDoubleBitEcc": "ECC_DBE",
    "GpuMissing": "GPU_COUNT_LOW",
    "GPUMissingFromExporter": "GPU_COUNT_LOW",
    "NvlinkDown": "NVLINK_DOWN",
    "InfinibandLinkDown": "IB_LINK_DOWN",
    "InfinibandLinkDegraded": "IB_LINK_DEGRADED",
    "InfinibandHcaMissing": "HCA_FELL_OFF_BUS",
}


class ApiSettings(Settings):
    # Who may call what: caller name -> a token and its role (tokens.py). No tokens: every
    # write is refused (401), never accepted unchecked. An operator's name is the person.
    api_tokens: dict[str, TokenGrant] = Field(default_factory=dict)
    # People, apart from the services: person -> the SHA-256 of their own operator token
    # (`autoclusters api token --role operator --name <person>` prints both). The same as
    # an operator grant in api_tokens; kept apart so a deployment lists its people once.
    api_operators: dict[str, str] = Field(default_factory=dict)
    # Reads (GET /v1/incidents...) need a reader's or operator's token too; /healthz never
    # does, /metrics only from a caller that is not on this machine's loopback.
    api_auth_reads: bool = False

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8480, ge=0, le=65535)

    # Where node names are checked: Slurm (sinfo, cached) or a fixed list (hostlist
    # expressions such as gpu-[001-128]), for clusters the API host cannot reach with sinfo.
    api_inventory: Literal["slurm", "static"] = "slurm"
    api_nodes: list[str] = Field(default_factory=list)
    api_inventory_ttl_s: float = Field(default=30, ge=0)

    # An alert (or report) naming a node the inventory does not know:
    #   reject  the whole payload is refused with 404 and nothing starts (Alertmanager
    #           counts the failed notification, so someone sees it);
    #   skip    known nodes are acted on, unknown ones are listed in the 202 answer.
    api_unknown_node: Literal["reject", "skip"] = "reject"

    # Extra or replacing entries for DEFAULT_ALERT_FAULTS; "" ignores an alertname.
    api_alert_faults: dict[str, str] = Field(default_factory=dict)

    # Temporal calls in flight at once, over all nodes (one per node at a time anyway).
    api_max_in_flight: int = Field(default=64, ge=1)
    # How long a request waits for Temporal to accept its alerts before answering 503.
    api_temporal_timeout_s: float = Field(default=10, gt=0)
    api_retry_after_s: int = Field(default=5, ge=1)
    # fingerprint+startsAt (agent: report_id) already accepted: Alertmanager re-sends a
    # firing alert every repeat_interval (default 4 h) and retries on 5xx.
    api_dedupe_ttl_s: float = Field(default=6 * 3600, ge=0)
    api_dedupe_max: int = Field(default=200_000, ge=1)
    api_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    # An alert of a fault kind the node's open incident has (Temporal said so less than
    # this long ago) is answered `joined` at once and delivered after api_join_flush_s,
    # with the node's other such alerts, in one call. 0: every alert waits for Temporal.
    api_open_incident_ttl_s: float = Field(default=2.0, ge=0)
    api_join_flush_s: float = Field(default=0.5, ge=0)
    # How long a payload's firing alerts wait for the read of their nodes' last repairs
    # (clients/api/repaired_since.py: an alert that began before one is left out). A read
    # slower than this is unknown and leaves nothing out. 0: never read.
    api_repaired_since_wait_s: float = Field(default=2.0, ge=0)
    # An alert storm: this many nodes' alerts on their way to Temporal at once. Then no
    # request waits for a worker (clients/api/storm.py): a node's incident is answered
    # `opened` once Temporal's server started it, and alerts for an incident known open,
    # of any fault kind, are answered `joined` and trail to it. 0: never.
    api_storm_nodes: int = Field(default=8, ge=0)

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _grants(cls, v: Any) -> dict[str, Any]:
        return parse_grants(v)

    @field_validator("api_alert_faults")
    @classmethod
    def _fault_templates(cls, v: dict[str, str]) -> dict[str, str]:
        for name, template in v.items():
            probe = template.replace("{xid}", "1")
            if template and not FAULT_PATTERN.match(probe):
                raise ValueError(f"alertname {name}: {template!r} is not a fault kind")
        return v

    def alert_faults(self) -> dict[str, str]:
        return {**DEFAULT_ALERT_FAULTS, **self.api_alert_faults}

    @field_validator("api_operators")
    @classmethod
    def _people(cls, v: dict[str, str]) -> dict[str, str]:
        for person, sha in v.items():
            TokenGrant(role="operator", sha256=sha)  # the same check as in api_tokens
            if not person.strip():
                raise ValueError("api_operators: a person needs a name")
        return v

    def grant_digests(self) -> list[tuple[bytes, str, Role]]:
        """(SHA-256 of the token, caller name, role) for every grant."""
        out = [(g.digest(), name, g.role) for name, g in self.api_tokens.items()]
        out += [(bytes.fromhex(sha), p, "operator") for p, sha in self.api_operators.items()]
        return out

    @model_validator(mode="after")
    def _one_grant_a_name(self) -> ApiSettings:
        if both := sorted(set(self.api_tokens) & set(self.api_operators)):
            raise ValueError(f"{', '.join(both)}: in both api_tokens and api_operators")
        return self
