"""What the scale benchmark reads back and prints: step latencies against a lone incident,
the fleet guard's admissions, history per incident, memory and CPU per worker."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from autoclusters.core.models import IncidentState

# The guard's steps: the admission latency (with the limits raised nothing waits in its
# queue, so this is the round trip: activity, Slurm view, update-with-start, guard task).
GUARD_STEPS = ("guard_register", "admit_quarantine", "admit_repair")
PAGE_SIZE = 4096


def pct(values: list[float], q: float) -> float:
    vs = sorted(values)
    return vs[min(len(vs) - 1, round(q * (len(vs) - 1)))] if vs else float("nan")


def step_durations(state: IncidentState) -> dict[str, float]:
    """Seconds per step name (summed when a step ran more than once)."""
    out: dict[str, float] = {}
    for s in state.steps:
        if s.finished_at is not None:
            out[s.name] = out.get(s.name, 0.0) + (s.finished_at - s.started_at).total_seconds()
    return out


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) in KiB, from /proc/<pid>/status; {} once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process used so far."""
    import os

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return float("nan")
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class RunResult:
    workers: int
    incidents: int
    nodes: int
    wall_s: float = 0.0  # first open to last close
    statuses: dict[str, int] = field(default_factory=dict)
    open_s: list[float] = field(default_factory=list)  # update-with-start per incident
    steps: dict[str, list[float]] = field(default_factory=dict)  # under load
    lone: dict[str, float] = field(default_factory=dict)  # one incident alone
    lone_total_s: float = 0.0
    total_s: list[float] = field(default_factory=list)  # open to close per incident
    events: list[int] = field(default_factory=list)
    history_bytes: list[int] = field(default_factory=list)
    guard_events: int = 0
    guard_bytes: int = 0
    guard_runs: int = 0
    rss_kib: list[int] = field(default_factory=list)  # per worker, at the end
    peak_kib: list[int] = field(default_factory=list)  # per worker, VmHWM
    cpu_s: list[float] = field(default_factory=list)  # per worker, during the storm
    server_cpu_s: float = 0.0
    standin_cpu_s: float = 0.0
    unfinished: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # failed workflows, by message
    open_errors: dict[str, int] = field(default_factory=dict)  # retried opens, by error
    worker_errors: dict[str, int] = field(default_factory=dict)  # logged, by first words

    @property
    def per_minute(self) -> float:
        done = sum(self.statuses.values())
        return 60 * done / self.wall_s if self.wall_s > 0 else 0.0

    def take(self, state: IncidentState) -> None:
        for name, secs in step_durations(state).items():
            self.steps.setdefault(name, []).append(secs)
        if state.closed_at is not None:
            self.total_s.append((state.closed_at - state.request.opened_at).total_seconds())
        self.statuses[state.status] = self.statuses.get(state.status, 0) + 1


def print_run(r: RunResult) -> None:
    mib = 1024
    print(f"\n=== {r.workers} worker process(es): {r.incidents} incidents, {r.nodes} nodes ===")
    print(f"closed:       {dict(sorted(r.statuses.items()))}; unfinished {r.unfinished}")
    print(f"throughput:   {r.per_minute:,.0f} incidents/minute ({r.wall_s:.1f} s first open "
          "to last close)")  # fmt: skip
    print(f"open call:    p50 {pct(r.open_s, .5) * 1000:.0f} ms, p99 "
          f"{pct(r.open_s, .99) * 1000:.0f} ms (update-with-start, as the API opens)")  # fmt: skip
    print(f"incident:     p50 {pct(r.total_s, .5):.1f} s, p99 {pct(r.total_s, .99):.1f} s "
          f"open to close (lone incident: {r.lone_total_s:.1f} s)")  # fmt: skip
    for msg, count in sorted(r.failures.items(), key=lambda kv: -kv[1])[:5]:
        print(f"failed:       {count} x {msg}")
    if r.open_errors:
        print(f"open retried: {r.open_errors}")
    for line, count in sorted(r.worker_errors.items(), key=lambda kv: -kv[1])[:8]:
        print(f"worker log:   {count} x {line}")
    print(f"{'step (s)':<20}{'lone':>8}{'p50':>8}{'p99':>8}{'p99/lone':>10}")
    for name in sorted(r.steps, key=lambda n: -pct(r.steps[n], 0.5)):
        lone = r.lone.get(name)
        p50, p99 = pct(r.steps[name], 0.5), pct(r.steps[name], 0.99)
        ratio = f"{p99 / lone:>10.1f}" if lone else f"{'-':>10}"
        mark = "  <- fleet guard" if name in GUARD_STEPS else ""
        print(f"{name:<20}{lone if lone is not None else float('nan'):>8.3f}{p50:>8.3f}"
              f"{p99:>8.3f}{ratio}{mark}")  # fmt: skip
    guard = [v for n in GUARD_STEPS for v in r.steps.get(n, [])]
    print(f"guard admission: p50 {pct(guard, .5) * 1000:.0f} ms, p99 {pct(guard, .99) * 1000:.0f}"
          f" ms over {len(guard)} calls (register + quarantine + repair)")  # fmt: skip
    n = max(len(r.events), 1)
    print(f"history:      {statistics.mean(r.events or [0]):.0f} events, "
          f"{statistics.mean(r.history_bytes or [0]) / 1024:.1f} KiB per incident (max "
          f"{max(r.events or [0])} events, {max(r.history_bytes or [0]) / 1024:.1f} KiB); "
          f"fleet guard {r.guard_events / n:.1f} events, {r.guard_bytes / n / 1024:.1f} KiB "
          f"per incident over {r.guard_runs} run(s)")  # fmt: skip
    for i, (rss, peak, cpu) in enumerate(zip(r.rss_kib, r.peak_kib, r.cpu_s, strict=False)):
        print(f"worker {i + 1}:     RSS {rss / mib:.0f} MiB (peak {peak / mib:.0f} MiB), "
              f"CPU {cpu:.0f} s")  # fmt: skip
    print(f"other CPU:    Temporal dev server {r.server_cpu_s:.0f} s, stand-in cluster "
          f"{r.standin_cpu_s:.0f} s (2 cores shared by all)")  # fmt: skip


def print_summary(results: list[RunResult]) -> None:
    print("\n=== summary ===")
    print(f"{'workers':>8}{'inc/min':>10}{'wall s':>9}{'admit p50':>11}{'admit p99':>11}"
          f"{'RSS/worker MiB':>16}")  # fmt: skip
    for r in results:
        guard = [v for n in GUARD_STEPS for v in r.steps.get(n, [])]
        rss = statistics.mean(r.peak_kib or [0]) / 1024
        p50, p99 = pct(guard, 0.5) * 1000, pct(guard, 0.99) * 1000
        print(f"{r.workers:>8}{r.per_minute:>10,.0f}{r.wall_s:>9.1f}"
              f"{p50:>9.0f}ms{p99:>9.0f}ms{rss:>16.0f}")  # fmt: skip
