"""The node agents Prometheus scrapes: a file_sd list (`monitoring/agents.json`), one target
per running agent, labelled `node` (the shipped rules and the API read the node from it).

The sandbox writes its own nodes at `sandbox up`; a machine the emulated cloud creates later
(a scale up, a replacement) adds its agent when the agent starts, and a deleted machine's
agent leaves with it, so Prometheus scrapes exactly the agents that run, as a
Kubernetes ServiceMonitor follows a DaemonSet's pods. Prometheus re-reads the file when it
changes. Writers are the CLI and the Crusoe emulator's threads: a lock file serialises the
read-modify-write, and each write replaces the file whole.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from autoclusters.sandbox.runtime.config import SandboxConfig

JOB = "dcgm-exporter"  # the job name a dcgm-exporter scrape has on a real cluster


def path(cfg: SandboxConfig) -> Path:
    return cfg.state_dir / "monitoring" / "agents.json"


def nodes(cfg: SandboxConfig) -> list[str]:
    """The nodes whose agents are listed now."""
    try:
        doc = json.loads(path(cfg).read_text())
    except (OSError, ValueError):
        return []
    return sorted(t["labels"]["node"] for t in doc)


def write(cfg: SandboxConfig, names: Iterable[str]) -> None:
    with _locked(cfg):
        _write(cfg, set(names))


def add(cfg: SandboxConfig, node: str) -> None:
    _change(cfg, lambda names: names | {node})


def remove(cfg: SandboxConfig, node: str) -> None:
    _change(cfg, lambda names: names - {node})


def _change(cfg: SandboxConfig, how: Callable[[set[str]], set[str]]) -> None:
    with _locked(cfg):
        before = set(nodes(cfg))
        after = how(before)
        if after != before:
            _write(cfg, after)


def _write(cfg: SandboxConfig, names: set[str]) -> None:
    doc = [
        {"targets": [f"127.0.0.1:{cfg.agent_metrics_port(n)}"], "labels": {"node": n}}
        for n in sorted(names)
    ]
    tmp = path(cfg).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path(cfg))


@contextmanager
def _locked(cfg: SandboxConfig) -> Iterator[None]:
    path(cfg).parent.mkdir(parents=True, exist_ok=True)
    with open(path(cfg).with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
