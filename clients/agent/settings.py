"""The agent's settings: environment (AUTOCLUSTERS_AGENT_*) over defaults; the CLI overrides.

Every threshold is here with its unit and the reason for its default. Checks run every
`interval_s`; a condition fault must hold for `hold_checks` consecutive checks before it is
reported, so the time to detect one is about `hold_checks * interval_s`. Events (Xids,
recovery-action changes, GPU lost) do not wait for a check: the backend wakes the agent,
which checks and reports at once (at most one such check per `event_check_gap_s`). A link
fault (`LINK_FAULTS`) is held in seconds, not checks: the link watch reads the ports every
`link_watch_s` and wakes the agent when one changes state, and a port down for `link_hold_s`
fires (agent.py, link_watch.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_HOME = Path.home() / ".autoclusters" / "agent"
# Held for `link_hold_s` seconds, not `hold_checks` checks, and read by the link watch's
# checks between the periodic ones: an InfiniBand port not ACTIVE / LinkUp.
LINK_FAULTS = frozenset({"IB_LINK_DOWN"})


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOCLUSTERS_AGENT_", extra="ignore")

    # --- where reports go ------------------------------------------------------------------
    api_url: str | None = Field(default=None, description="API base URL; POST {api}/v1/reports")
    token: SecretStr | None = Field(default=None, description="bearer token for the API")
    spool_dir: Path | None = Field(
        default=None, description="reports not yet accepted, and the agent's state; "
        "default ~/.autoclusters/agent/<node>"
    )  # fmt: skip
    request_timeout_s: float = Field(default=5.0, gt=0, description="one POST")
    send_attempts: int = Field(default=3, ge=1, description="tries per report per flush")
    backoff_s: float = Field(default=0.5, ge=0, description="first retry delay; doubles")
    max_backoff_s: float = Field(
        default=60.0, gt=0, description="longest wait between flushes while the API is down"
    )
    # Off where Prometheus scrapes the agent's /metrics and Alertmanager's webhook opens the
    # incidents (one detection path, not two); health snapshots still go to the API (the
    # health gate's evidence).
    report_faults: bool = Field(
        default=True, description="POST fault reports to the API; off: only health "
        "snapshots and /metrics"
    )  # fmt: skip

    # --- the loop and the debounce --------------------------------------------------------
    # Fatal events do not wait for it (the backend wakes the agent): the interval paces the
    # conditions' debounce (hold_checks x interval), their resolving, snapshots and /metrics.
    # The sandbox runs the same interval (sandbox/runtime/daemons.py passes none).
    interval_s: float = Field(default=10.0, gt=0, description="seconds between periodic checks")
    # An Xid storm (thousands a second from a misbehaving job) must not turn into back-to-back
    # NVML reads: the first event of a burst is checked at once, the rest of it together.
    event_check_gap_s: float = Field(
        default=0.5, ge=0, description="at most one event-woken check per this many seconds"
    )
    snapshot_interval_s: float = Field(
        default=10.0, gt=0, description="a health snapshot goes to the API this often (and at "
        "start, and at once when what the check sees changes)"
    )  # fmt: skip
    hold_checks: int = Field(
        default=3, ge=1, description="consecutive checks a condition must hold to fire"
    )
    clear_checks: int = Field(
        default=3, ge=1, description="consecutive clean checks before a fault resolves"
    )
    # Thermal throttling is normal in bursts; only a sustained one (5 min at 10 s) matters.
    # JOB_HANG and SLOW_NODE are immediate findings: their thresholds are their debounce.
    hold_checks_by_fault: dict[str, int] = Field(default_factory=lambda: {"THERMAL": 30})
    # A port that goes down stops every job on the node at once: waiting for `hold_checks`
    # periodic checks (10-30 s) was most of a lost node's downtime (docs/recovery.md). The
    # watch reads the ports with the periodic check's reader (sysfs: ~30 small files a
    # port; the sandbox: the fake file) once a second, no NVML, and wakes the agent for a
    # link check when a port's state changes. 0: off (a down port's hold is then timed
    # from the periodic check that first sees it).
    link_watch_s: float = Field(
        default=1.0, ge=0, description="the link watch reads the ports' state this often; 0: off"
    )
    # The hold the two-checks rule meant: a port that comes back within it (a retrain, a
    # cable reseated, a switch's port flap) is no fault. 2 s is above a port's link
    # retraining (sub-second on NDR) and well below a job's collective timeout. A port down
    # for this long fires within link_hold_s + link_watch_s (a flap shorter never fires).
    link_hold_s: float = Field(
        default=2.0, ge=0, description="seconds a port must stay down before IB_LINK_DOWN "
        "fires (instead of hold_checks)"
    )  # fmt: skip
    rereport_s: float = Field(
        default=3600, gt=0, description="a fault still firing is re-sent this often"
    )
    flap_window_s: float = Field(
        default=3600, gt=0, description="a fault that fired max_flaps times in this window "
        "stays firing until it has been clear for the whole window"
    )  # fmt: skip
    max_flaps: int = Field(default=3, ge=1)
    event_latch_s: float = Field(
        default=600, gt=0, description="an event (Xid) fault holds this long after the event"
    )
    ignored_xids: list[int] = Field(default_factory=list, description="Xids never reported")

    # --- what the node should have ----------------------------------------------------------
    expected_gpus: int | None = Field(
        default=None, ge=0, description="GPUs of the node type; None: the most seen"
    )
    expected_nvlinks: int | None = Field(
        default=None, ge=0, description="active NVLinks per GPU (18 on H100/H200 SXM); "
        "None: every link once seen active"
    )  # fmt: skip
    expected_hcas: list[str] = Field(
        default_factory=list, description="HCA names (mlx5_0, ...); empty: every one seen"
    )
    expected_ib_rate_gbps: float | None = Field(
        default=None, gt=0, description="port rate (NDR 400, HDR 200); None: not checked"
    )
    ib_ignore: list[str] = Field(
        default_factory=list, description="fnmatch patterns of 'hca' or 'hca/port' not checked"
    )

    # --- thresholds (reference: docs on NVML, DCGM, NVSentinel) -----------------------------
    fabric_grace_s: float = Field(default=300, ge=0, description="NVSwitch fabric set-up time")
    thermal_margin_c: int = Field(default=5, ge=0, description="warn at slowdown minus this")
    pcie_replay_per_min: float = Field(default=8, gt=0, description="DCGM's PCIe limit")
    pcie_window_s: float = Field(default=300, gt=0)
    nvlink_errors_per_min: float = Field(default=10, gt=0, description="replay+recovery+CRC")
    nvlink_window_s: float = Field(default=300, gt=0)
    ib_symbol_errors_per_hour: float = Field(default=120, gt=0, description="IBTA 1e-12 BER")
    ib_symbol_errors_per_s: float = Field(default=10, gt=0, description="NVSentinel burst")
    ib_link_error_recovery_per_min: float = Field(default=5, gt=0, description="flapping")
    ib_event_window_s: float = Field(
        default=600, gt=0, description="a link_downed increase holds this long"
    )

    # --- NVML -------------------------------------------------------------------------------
    nvml_timeout_s: float = Field(default=10, gt=0, description="a call past this is hung")
    event_wait_ms: int = Field(default=1000, gt=0, description="one nvmlEventSetWait_v2")

    # --- /metrics: dcgm-exporter's and node-exporter's series (metrics.py) ------------------
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve /metrics on this port (dcgm-exporter "
        "uses 9400); None: not served. 0 picks a free port (tests)"
    )  # fmt: skip
    metrics_host: str = Field(
        default="127.0.0.1", description="address /metrics listens on; 0.0.0.0 for a "
        "Prometheus on another machine (then metrics_token is required)"
    )  # fmt: skip
    # The series name the node, its faults and its boot: off loopback, only a scraper that
    # shows this token reads them (the agent refuses to serve them open).
    metrics_token: SecretStr | None = Field(
        default=None, description="bearer token /metrics asks for; required off loopback"
    )
    xid_count_window_s: float = Field(
        default=300, gt=0, description="DCGM_EXP_XID_ERRORS_COUNT's window "
        "(dcgm-exporter's --xid-count-window-size, 5 min)"
    )  # fmt: skip

    # --- jobs' progress: silent faults (progress_rules.py, docs/detection.md) --------------
    # The directory the jobs' ranks write their progress to (core/job_progress.py; the jobs
    # find it in $AUTOCLUSTERS_PROGRESS_DIR). None: not read, no JOB_HANG or SLOW_NODE.
    progress_dir: Path | None = Field(
        default=None, description="jobs' progress files (<dir>/<job>/rank-<n>.json); None: off"
    )
    # Between the periodic checks: a hang is named within this of its threshold.
    progress_interval_s: float = Field(
        default=2.0, gt=0, description="the progress files are read and judged this often"
    )
    # A hang: no rank stepped for max(floor, k x the job's p95 step time over its ranks'
    # last 32 steps). The floor is above a 20 s data-loader stall with margin (21 s between
    # steps at a 1 s step) and below the 30 s detection target; NVRx's fixed 60 s
    # / 90 s need no tail, ours follows a job's own periodic slow steps (k x its tail).
    hang_floor_s: float = Field(default=25.0, gt=0, description="a hang threshold's floor")
    hang_k: float = Field(default=5.0, gt=0, description="x the job's step-time tail")
    hang_quantile: float = Field(default=0.95, gt=0, le=1, description="the tail's quantile")
    # A rank's heartbeat (its file's written_at, every 5 s by default) is stopped after
    # max(this, 3 heartbeats).
    heartbeat_stale_s: float = Field(default=15.0, gt=0, description="heartbeat stopped after")
    # A pause a rank declares (a checkpoint save, an evaluation) excuses a stall this long.
    pause_max_s: float = Field(default=1800.0, gt=0, description="longest declared pause")
    # A straggler: its busy time >= slow_ratio x the other nodes' median on each of
    # slow_window steps. 1.5: a 2x straggler with margin, far above ranks' normal spread.
    slow_ratio: float = Field(default=1.5, gt=1, description="slow node: x the others' median")
    slow_window: int = Field(default=10, ge=1, le=256, description="consecutive slow steps")
    # Files not written for this long are an old run's (a rank killed before it could
    # remove its file): ignored.
    progress_forget_s: float = Field(default=3600.0, gt=0, description="ignore older files")
    # A rank file of this node whose pid is not running is a finished rank's. Off where the
    # agent does not share the jobs' PID namespace.
    progress_pid_check: bool = Field(default=True, description="ignore ranks whose pid is gone")
    # The cluster's remediation policy (the worker's policy_file): its `job_thresholds` set
    # the hang and slow thresholds above per job (core/job_thresholds.py). None: these
    # settings for every job. A file that does not load stops the agent's start: a typo
    # must not silently fall back to the defaults.
    policy_file: Path | None = Field(
        default=None, description="cluster policy YAML; its job_thresholds apply per job"
    )
    # A hung job's evidence carries its ranks' Python stacks on this node (py-spy dump,
    # clients/agent/stacks.py), where py-spy is installed; absent, the evidence says so.
    stack_dumps: bool = Field(default=True, description="py-spy stacks in JOB_HANG evidence")
    py_spy: str = Field(default="py-spy", description="py-spy's path or name on PATH")

    # --- Kubernetes (optional) --------------------------------------------------------------
    k8s_condition: bool = Field(default=False, description="set the GpuUnhealthy condition")
    kubeconfig: Path | None = Field(default=None, description="None: in-cluster account")

    def hold_for(self, fault: str) -> int:
        return self.hold_checks_by_fault.get(fault, self.hold_checks)

    def hold_seconds(self, fault: str) -> float | None:
        """The seconds `fault` must hold to fire, where it is held in seconds (else None:
        `hold_for` checks)."""
        return self.link_hold_s if fault in LINK_FAULTS else None

    def spool_for(self, node: str) -> Path:
        return self.spool_dir if self.spool_dir is not None else DEFAULT_HOME / node
