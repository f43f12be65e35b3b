"""The agent's loop: read, classify, debounce, report; every `interval_s`, until stopped.

One `check()` reads the GPU backend (and its events) and the InfiniBand source, turns
the readings into findings, feeds them to the debouncer, and hands the resulting reports
to the sink (the spooling reporter, or `--print`). The classifier's baselines and the
debouncer's state are saved after every check (`<spool>/state.json`, atomically), so a
restarted agent neither re-reports what it reported nor forgets to resolve it.

A check never raises out of `run`: a failed check is logged and the next one runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ValidationError

from autoclusters.clients.agent.backend import GpuBackend, IbSource
from autoclusters.clients.agent.classify import Classifier, ClassifierMemory, Finding
from autoclusters.clients.agent.debounce import DebounceMemory, Debouncer
from autoclusters.clients.agent.readings import GpuReadings, IbReadings
from autoclusters.clients.agent.report import NodeReport
from autoclusters.clients.agent.reporter import ReportSink, write_atomic
from autoclusters.clients.agent.settings import AgentSettings

log = logging.getLogger(__name__)
STATE_FILE = "state.json"


class ConditionSink(Protocol):
    def update(self, firing: dict[str, str]) -> None: ...


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
    ) -> None:
        self.node = node
        self.settings = settings
        self.backend = backend
        self.infiniband = infiniband
        self.sink = sink
        self.state_file = state_file
        self.clock = clock
        self.condition = condition
        state = self._load_state()
        self.classifier = Classifier(settings, state.classifier if state else None)
        self.debouncer = Debouncer(
            hold_for=settings.hold_for,
            clear_checks=settings.clear_checks,
            rereport_s=settings.rereport_s,
            flap_window_s=settings.flap_window_s,
            max_flaps=settings.max_flaps,
            memory=state.debounce if state else None,
        )

    def check(self) -> CheckResult:
        now = self.clock()
        gpus = self.backend.read() if self.backend is not None else None
        events = self.backend.events() if self.backend is not None else []
        ib = self.infiniband.read() if self.infiniband is not None else None
        findings = self.classifier.classify(
            now=now, gpus=gpus, events=events, ib=ib, check_ib=self.infiniband is not None
        )
        observed = datetime.fromtimestamp(now, UTC)
        reports: list[NodeReport] = []
        for t in self.debouncer.update(now, findings):
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
        return CheckResult(now, gpus, ib, findings, reports, firing)

    def run(self, stop: threading.Event) -> None:
        """Check every interval until `stop` is set."""
        interval = self.settings.interval_s
        next_at = time.monotonic()
        while not stop.is_set():
            try:
                self.check()
            except Exception:
                log.exception("check failed; the next one runs in %.0f s", interval)
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # a slow check: start the next at once, do not try to catch up
                next_at, delay = time.monotonic(), 0.0
            stop.wait(delay)

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
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.state_file, state.model_dump_json().encode())
