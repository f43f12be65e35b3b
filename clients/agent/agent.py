"""The agent's loop: read, classify, debounce, report; every `interval_s`, and at once on
an event, until stopped.

One `check()` reads the GPU backend (and its events) and the InfiniBand source, turns
the readings into findings, feeds them to the debouncer, and hands the resulting reports
to the sink (the spooling reporter, or `--print`). The classifier's baselines and the
debouncer's state are saved after every check (`<spool>/state.json`, atomically), so a
restarted agent neither re-reports what it reported nor forgets to resolve it.

Fatal events do not wait for the interval. While `run` runs, the backend holds the agent's
`wake` and calls it from the thread that receives an event (NVML's event thread, the fake
file's watcher); the loop then runs an event check, `check(event=True)`: the events and a
lost GPU, classified and debounced alone (they fire on their first check), reported and
flushed through the same spool. The conditions' streaks, the counters and the snapshot
are left to the periodic checks, so `hold_checks` still counts intervals. A burst of
events makes one check per `event_check_gap_s`; a fault already firing is not reported
again. An event check that finds a new boot id runs as a full check (a real machine's
agent starts again with it, and checks at once).

Links take the same path (link_watch.py): while `run` runs, the link watch reads the
InfiniBand ports every `link_watch_s` and wakes the agent when a port's state changes; the
loop then runs a link check, `check_links()`: the ports' state alone (IB_LINK_DOWN),
classified and debounced for that fault only, at most one per `event_check_gap_s` as the
events' checks. A link fault is held in seconds (`link_hold_s`), not checks: a port seen
down is checked again when its hold is over (`Debouncer.due`) and fires if it is still
down, so it fires within `link_hold_s + link_watch_s` of going down; one seen up again
before then ends the streak (a flap never fires). Resolving stays with the periodic
checks (`clear_checks`), and a link read that fails moves nothing.

Jobs' progress (`progress_dir`, docs/detection.md): each periodic check also reads the rank
files the jobs write there (core/job_progress.py) and judges them (progress_rules.py:
JOB_HANG on a hung job's culprit, SLOW_NODE on a straggler, when they are on this node);
between periodic checks a progress check does only that, every `progress_interval_s`, so
a hang is reported within that of its threshold. Their findings are immediate (the rules'
thresholds are their debounce): a progress check fires them like an event check, and they
resolve as every fault does, after `clear_checks` periodic checks without them. Each job is
judged with its own thresholds, the cluster policy's `job_thresholds` over the settings
(`policy_file`), and a hang named here carries its ranks' stacks (job_verdicts.py).

A check never raises out of `run`: a failed check is logged and the next one runs.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ValidationError

from autoclusters.clients.agent.backend import GpuBackend, IbSource, read_boot_id
from autoclusters.clients.agent.classify import (
    IB_ACTIVE,
    IB_LINK_UP,
    Classifier,
    ClassifierMemory,
    Finding,
)
from autoclusters.clients.agent.debounce import DebounceMemory, Debouncer
from autoclusters.clients.agent.job_verdicts import JobVerdicts
from autoclusters.clients.agent.link_watch import LinkWatch, unreadable
from autoclusters.clients.agent.metrics import AgentMetrics
from autoclusters.clients.agent.progress_rules import ProgressThresholds, Verdicts
from autoclusters.clients.agent.readings import GpuEvent, GpuReadings, IbReadings, state_number
from autoclusters.clients.agent.reporter import Answer, Outcome, ReportSink, write_atomic
from autoclusters.clients.agent.settings import LINK_FAULTS, AgentSettings
from autoclusters.clients.agent.stacks import find_py_spy
from autoclusters.core.job_progress import RankProgress, read_progress
from autoclusters.core.node_report import ActiveFault, HealthSnapshot, IbPortState, NodeReport
from autoclusters.core.policy import load_policy
from autoclusters.integrations.metrics_http import MetricsServer

log = logging.getLogger(__name__)
STATE_FILE = "state.json"
# A `stop` set by another thread ends the loop's wait within this (`wake()` ends it at once).
STOP_POLL_S = 0.25
# A held link fault whose check could not read the ports is read again after this.
LINK_RETRY_S = 1.0
# A link check due at a fault's hold runs this much after it: the loop's monotonic clock and
# the check's wall clock must agree that the hold is over.
LINK_DUE_SLACK_S = 0.01


class ConditionSink(Protocol):
    def update(self, firing: dict[str, str]) -> None: ...


class SnapshotSink(Protocol):
    def send_snapshot(self, snapshot: HealthSnapshot) -> Answer: ...


def active_faults(findings: dict[str, Finding], observed: datetime) -> list[ActiveFault]:
    """What the hardware shows in this check: a condition at the check's time, an event
    fault (an Xid, latched for a while after it) at its latest event's time."""
    out = []
    for fault, f in sorted(findings.items()):
        times = [s.get("at") for s in f.subjects]
        if times and all(isinstance(t, str) for t in times):
            last = max(datetime.fromisoformat(str(t)) for t in times)
        else:
            last = observed
        out.append(ActiveFault(fault=fault, message=f.message, last_at=last))
    return out


def ib_ports(ib: IbReadings | None) -> list[IbPortState] | None:
    if ib is None:
        return None
    return [
        IbPortState(
            hca=p.hca, port=p.port, state=p.state, phys_state=p.phys_state,
            healthy=state_number(p.state) == IB_ACTIVE
            and state_number(p.phys_state) == IB_LINK_UP,
        )
        for p in ib.ports
    ]  # fmt: skip


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs here (as the agent sees the PID namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    return True


def progress_thresholds(s: AgentSettings) -> ProgressThresholds:
    return ProgressThresholds(
        hang_k=s.hang_k, hang_quantile=s.hang_quantile, hang_floor_s=s.hang_floor_s,
        heartbeat_stale_s=s.heartbeat_stale_s, pause_max_s=s.pause_max_s,
        slow_ratio=s.slow_ratio, slow_window=s.slow_window, forget_s=s.progress_forget_s,
    )  # fmt: skip


class AgentState(BaseModel):
    node: str
    classifier: ClassifierMemory
    debounce: DebounceMemory


@dataclass
class CheckResult:
    at: float
    gpus: GpuReadings | None
    infiniband: IbReadings | None
    findings: dict[str, Finding]
    reports: list[NodeReport]
    firing: dict[str, str] = field(default_factory=dict)  # fault -> message
    snapshot: HealthSnapshot | None = None
    event: bool = False  # an event, progress or link check: no full reading, no snapshot


class Agent:
    def __init__(
        self,
        *,
        node: str,
        settings: AgentSettings,
        backend: GpuBackend | None,
        infiniband: IbSource | None,
        sink: ReportSink,
        state_file: Path | None = None,
        clock: Callable[[], float] = time.time,
        condition: ConditionSink | None = None,
        snapshots: SnapshotSink | None = None,
        metrics: AgentMetrics | None = None,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.node = node
        self.settings = settings
        self.backend = backend
        self.infiniband = infiniband
        self.sink = sink
        self.state_file = state_file
        self.clock = clock
        self.condition = condition
        self.snapshots = snapshots
        self._snapshot_sent: tuple[float, tuple[object, ...]] | None = None
        self._state_saved: bytes | None = None  # what `_save_state` last wrote
        if metrics is None and settings.metrics_port is not None:
            metrics = AgentMetrics(node, xid_window_s=settings.xid_count_window_s)
        self.metrics = metrics  # fed every check; served by `run` when metrics_port is set
        self.metrics_server: MetricsServer | None = None  # while `run` serves it
        self._wakeup = threading.Event()  # set by `wake` and `wake_links`: ends the loop's wait
        self._events_waiting = threading.Event()  # set by `wake`: for an event check
        self._links_changed = threading.Event()  # set by `wake_links`: for a link check
        self.link_watch: LinkWatch | None = None  # while `run` runs, where it is on
        self._last_boot: str | None = None  # the boot id the last check saw
        self._last_ib: IbReadings | None = None  # the last full check's, for /metrics
        self._last_gpus: GpuReadings | None = None  # for a progress check's evidence
        self.alive = alive  # whether a local rank's process still runs
        self.thresholds = progress_thresholds(settings)
        self.verdicts = Verdicts()  # the last progress read's
        # Per job: the policy's job_thresholds over these settings, and a hung job's stacks.
        # A policy file that does not load raises here: the agent does not start on a typo.
        entries = (
            load_policy(settings.policy_file).job_thresholds
            if settings.policy_file is not None
            else []
        )
        self.jobs = JobVerdicts(
            node, self.thresholds, entries,
            py_spy=find_py_spy(settings.py_spy), stack_dumps=settings.stack_dumps,
        )  # fmt: skip
        state = self._load_state()
        self.classifier = Classifier(settings, state.classifier if state else None)
        self.debouncer = Debouncer(
            hold_for=settings.hold_for,
            hold_seconds=settings.hold_seconds,
            clear_checks=settings.clear_checks,
            rereport_s=settings.rereport_s,
            flap_window_s=settings.flap_window_s,
            max_flaps=settings.max_flaps,
            memory=state.debounce if state else None,
        )

    def wake(self) -> None:
        """Check at once: the backend calls this, from its own thread, when an event arrives."""
        self._events_waiting.set()
        self._wakeup.set()

    def wake_links(self) -> None:
        """Check the links at once: the link watch calls this, from its thread, when a port's
        state changed."""
        self._links_changed.set()
        self._wakeup.set()

    def check(self, *, event: bool = False) -> CheckResult:
        """One check. `event`: the backend woke the agent; only the events and a lost GPU
        are classified and debounced (module docstring), unless the machine booted since."""
        now = self.clock()
        gpus = self.backend.read() if self.backend is not None else None
        events = self.backend.events() if self.backend is not None else []
        boot_id = self._boot_id()
        self.classifier.on_boot(boot_id)
        if event and boot_id == self._last_boot:
            return self._event_check(now, gpus, events, boot_id)
        self._last_boot = boot_id
        ib = self.infiniband.read() if self.infiniband is not None else None
        self._last_ib, self._last_gpus = ib, gpus
        if self.metrics is not None:
            self.metrics.observe(now, gpus, events, ib, boot_id)
        findings = self.classifier.classify(
            now=now, gpus=gpus, events=events, ib=ib, check_ib=self.infiniband is not None
        )
        findings.update(self._progress(now))
        observed = datetime.fromtimestamp(now, UTC)
        reports, firing = self._report(now, gpus, findings, immediate_only=False, boot=boot_id)
        snapshot = self._snapshot(observed, gpus, ib, findings, firing, boot_id)
        self._send_snapshot(now, snapshot)
        return CheckResult(now, gpus, ib, findings, reports, firing, snapshot)

    def _event_check(
        self, now: float, gpus: GpuReadings | None, events: list[GpuEvent], boot_id: str
    ) -> CheckResult:
        if self.metrics is not None:  # the Xid series at once; InfiniBand as last read
            self.metrics.observe(now, gpus, events, self._last_ib, boot_id)
        findings = self.classifier.classify_events(now=now, gpus=gpus, events=events)
        reports, firing = self._report(now, gpus, findings, immediate_only=True, boot=boot_id)
        return CheckResult(now, gpus, None, findings, reports, firing, event=True)

    def check_links(self) -> CheckResult:
        """The ports' state only: IB_LINK_DOWN read, classified and debounced alone (module
        doc). A read with errors is unknown: logged, and no track moves."""
        now = self.clock()
        ib = self.infiniband.read() if self.infiniband is not None else None
        boot = self._last_boot if self._last_boot is not None else self._boot_id()
        if errors := unreadable(ib):
            log.warning("link check: the ports' state could not be read (%s); nothing changes",
                        ", ".join(sorted(errors)))  # fmt: skip
            firing = {f: t.message for f, t in self.debouncer.firing.items()}
            return CheckResult(now, None, ib, {}, [], firing, event=True)
        findings = self.classifier.classify_links(ib)
        reports, firing = self._report(now, self._last_gpus, findings, only=LINK_FAULTS, boot=boot)
        return CheckResult(now, None, ib, findings, reports, firing, event=True)

    def check_progress(self) -> CheckResult:
        """Between periodic checks: read and judge the jobs' progress only (module doc)."""
        now = self.clock()
        findings = self._progress(now)
        boot = self._last_boot if self._last_boot is not None else self._boot_id()
        reports, firing = self._report(now, self._last_gpus, findings, immediate_only=True,
                                       boot=boot)  # fmt: skip
        return CheckResult(now, None, None, findings, reports, firing, event=True)

    def _progress(self, now: float) -> dict[str, Finding]:
        """The jobs' progress: read, exported, judged; this node's JOB_HANG / SLOW_NODE."""
        directory = self.settings.progress_dir
        if directory is None:
            return {}
        ranks = read_progress(directory)
        self.verdicts, findings = self.jobs.judge(ranks, now, gone=self._gone)
        if self.metrics is not None:
            self.metrics.observe_progress(now, self.verdicts.ranks, self.verdicts.thresholds)
        return findings

    def _gone(self, r: RankProgress) -> bool:
        """A rank of this node whose process has ended (it could not remove its file)."""
        return (
            self.settings.progress_pid_check
            and r.node == self.node
            and r.pid is not None
            and not self.alive(r.pid)
        )

    def _report(
        self,
        now: float,
        gpus: GpuReadings | None,
        findings: dict[str, Finding],
        *,
        immediate_only: bool = False,
        only: frozenset[str] | None = None,
        boot: str,
    ) -> tuple[list[NodeReport], dict[str, str]]:
        """Debounce, spool and send; returns the reports and what is firing now."""
        observed = datetime.fromtimestamp(now, UTC)
        reports: list[NodeReport] = []
        changes = self.debouncer.update(
            now, findings, immediate_only=immediate_only, only=only, boot=boot
        )
        for t in changes:
            evidence = {**t.evidence, "backend": gpus.backend if gpus else "none"}
            reports.append(
                NodeReport.build(
                    node=self.node,
                    fault=t.fault,
                    state=t.state,
                    observed_at=observed,
                    since=datetime.fromtimestamp(t.since, UTC),
                    sequence=t.sequence,
                    message=t.message,
                    evidence=evidence,
                )
            )
            log.info("%s %s %s: %s", self.node, t.fault, t.state.value, t.message)
        self.sink.submit(reports)
        self._save_state()
        self.sink.flush()
        firing = {f: t.message for f, t in self.debouncer.firing.items()}
        if self.condition is not None:
            self.condition.update(firing)
        return reports, firing

    def _snapshot(
        self,
        observed: datetime,
        gpus: GpuReadings | None,
        ib: IbReadings | None,
        findings: dict[str, Finding],
        firing: dict[str, str],
        boot_id: str,
    ) -> HealthSnapshot:
        count = None
        if gpus is not None:
            count = gpus.device_count if gpus.device_count is not None else len(gpus.gpus)
        expected = self.settings.expected_gpus
        if expected is None:
            expected = self.classifier.memory.max_gpu_count or None
        return HealthSnapshot.build(
            node=self.node,
            observed_at=observed,
            boot_id=boot_id,
            gpu_count=count,
            expected_gpus=expected,
            faults=active_faults(findings, observed),
            firing=sorted(firing),
            infiniband=ib_ports(ib) if self.infiniband is not None else None,
            backend=gpus.backend if gpus is not None else "none",
        )

    def _boot_id(self) -> str:
        boot = getattr(self.backend, "boot_id", None)
        return str(boot()) if callable(boot) else read_boot_id()

    def _send_snapshot(self, now: float, snap: HealthSnapshot) -> None:
        """At start, every snapshot interval, and at once when what is seen changes."""
        if self.snapshots is None:
            return
        seen = (
            snap.boot_id,
            snap.gpu_count,
            tuple(f.fault for f in snap.faults),
            tuple((p.hca, p.port, p.healthy) for p in snap.infiniband or []),
        )
        last, every = self._snapshot_sent, self.settings.snapshot_interval_s
        if last is not None and last[1] == seen and now - last[0] < every:
            return
        answer = self.snapshots.send_snapshot(snap)
        if answer.outcome is not Outcome.SENT:
            log.warning("health snapshot not taken: %s", answer.detail)
            return  # the next check tries again
        self._snapshot_sent = (now, seen)

    def run(self, stop: threading.Event) -> None:
        """Check every interval, and at once when the backend wakes the agent, until `stop`
        is set (then `wake()` ends the wait at once; else within STOP_POLL_S)."""
        port = self.settings.metrics_port
        if self.metrics is not None and port is not None:
            self.metrics_server = MetricsServer(
                self.metrics.registry, self.settings.metrics_host, port,
                self.settings.metrics_token, version=self.metrics.version,
            )  # fmt: skip
            log.info("metrics on %s", self.metrics_server.url)
        try:
            if self.backend is not None:
                self.backend.set_wake(self.wake)
            if self.infiniband is not None and self.settings.link_watch_s > 0:
                self.link_watch = LinkWatch(
                    self.infiniband, every_s=self.settings.link_watch_s, wake=self.wake_links
                )
                self.link_watch.start()
            self._loop(stop)
        finally:
            if self.link_watch is not None:
                self.link_watch.stop()
                self.link_watch = None
            if self.backend is not None:
                self.backend.set_wake(None)
            if self.metrics_server is not None:
                self.metrics_server.stop()
                self.metrics_server = None

    def _loop(self, stop: threading.Event) -> None:
        interval, gap = self.settings.interval_s, self.settings.event_check_gap_s
        every = self.settings.progress_interval_s if self.settings.progress_dir else math.inf
        next_at = time.monotonic()  # the next periodic check
        next_progress = math.inf  # the next progress check (a periodic check reads it too)
        link_due = math.inf  # the next link check a held link fault needs
        event_after = 0.0  # the next woken (event or link) check not before this
        while not stop.is_set():
            self._wakeup.clear()  # a wake-up from here on ends the wait below at once
            now = time.monotonic()
            if now >= next_at:
                self._events_waiting.clear()  # this check reads the events and links too
                self._links_changed.clear()
                self._check(event=False)
                next_at += interval
                if next_at < time.monotonic():  # a slow check: the next at once, no catch-up
                    next_at = time.monotonic()
                next_progress = time.monotonic() + every
                link_due = self._link_due()
                continue
            woken = self._events_waiting.is_set() or self._links_changed.is_set()
            if woken and now >= event_after:
                if self._events_waiting.is_set():
                    self._events_waiting.clear()  # an event during the check: another one
                    result = self._check(event=True)
                    if result is not None and not result.event:  # a new boot: interval anew
                        next_at = time.monotonic() + interval
                        self._links_changed.clear()  # that full check read the links
                if self._links_changed.is_set():
                    self._links_changed.clear()
                    self._check_links()
                event_after = time.monotonic() + gap
                link_due = self._link_due()
                continue
            if now >= link_due:
                self._check_links()
                link_due = self._link_due()
                continue
            if now >= next_progress:
                self._check_progress()
                next_progress = time.monotonic() + every
                continue
            due = min(next_at, next_progress, link_due)
            if woken:  # woken within the gap: the burst's next check is due then
                stop.wait(min(event_after, due) - now)
            else:
                self._wakeup.wait(min(due - now, STOP_POLL_S))

    def _link_due(self) -> float:
        """When (monotonic) the loop must check the links for a held link fault's hold to
        end (inf: none held); a hold already over (its check could not read the ports) is
        retried after LINK_RETRY_S."""
        fire_at = self.debouncer.due()
        if fire_at is None:
            return math.inf
        wait = fire_at - self.clock()
        if wait <= 0:
            wait = LINK_RETRY_S
        return time.monotonic() + wait + LINK_DUE_SLACK_S

    def _check(self, *, event: bool) -> CheckResult | None:
        """One check that never raises: None when it failed (logged)."""
        try:
            return self.check(event=event)
        except Exception:
            what = "event check" if event else "check"
            log.exception("%s failed; the next runs within %.0f s", what, self.settings.interval_s)
            return None

    def _check_links(self) -> None:
        try:
            self.check_links()
        except Exception:
            log.exception("link check failed; the ports are read again within %.0f s",
                          self.settings.interval_s)  # fmt: skip

    def _check_progress(self) -> None:
        try:
            self.check_progress()
        except Exception:
            log.exception("progress check failed; the next runs within %.0f s",
                          self.settings.progress_interval_s)  # fmt: skip

    def _load_state(self) -> AgentState | None:
        if self.state_file is None or not self.state_file.exists():
            return None
        try:
            state = AgentState.model_validate_json(self.state_file.read_bytes())
        except (OSError, ValidationError) as e:
            log.warning("ignoring unreadable agent state %s: %s", self.state_file, e)
            return None
        if state.node != self.node:
            log.warning("agent state %s is node %s's, not ours", self.state_file, state.node)
            return None
        return state

    def _save_state(self) -> None:
        if self.state_file is None:
            return
        state = AgentState(
            node=self.node, classifier=self.classifier.memory, debounce=self.debouncer.memory
        )
        data = state.model_dump_json().encode()
        # Most checks change nothing in it: a progress check every 2 s rewrote (and fsynced)
        # the same bytes, the largest part of an idle agent's CPU (issue 41).
        if data == self._state_saved and self.state_file.exists():
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_file, data)
        self._state_saved = data
