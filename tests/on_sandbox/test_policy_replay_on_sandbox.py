"""`policy replay` and `policy apply` on a real sandbox of this module's own, over a dozen
incidents it really had (issue 23's last done-when).

Twelve hardware faults are put on the sandbox's four machines through its fault-injection
path (sandbox/machines/hardware.py, as `sandbox hardware-fault`, the chaos and the bench do): each
node's health agent sees the Xid and reports it, the API opens the incident, and the
runbook repairs the machine; ten are XID_79 (seven cleared by a reboot, three only by a
new machine: the reboot fails its health gate and the incident climbs to replace), two
XID_48. Then the real CLI, pointed at the sandbox's settings as an operator's would be:

- `policy replay NEW.yaml` (NEW: the live policy with XID_79 straight to replace) reads
  back all twelve incidents from the sandbox's Temporal and shows, for every XID_79 one,
  its live rung and repairs beside the candidate's (replace), the outcome still resolved;
  the XID_48 ones are unchanged and not listed; `--json` says the same per incident;
- `policy apply NEW.yaml` refuses (exit 3, naming --accept-changes) and leaves the live
  policy file byte for byte; with --accept-changes it writes it.

The sandbox is this module's own, not the session's shared one: twelve incidents in a few
minutes would raise the shared nodes' recurrence counts and fill its breaker window for
every later test, and the replay must read exactly these incidents. It is stopped by its
recorded PIDs (the sandbox's own `down`), and nothing of it may be left alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from temporalio.client import Client

from autoclusters.clients.incident_history import IncidentHistories, read_incidents
from autoclusters.core.models import IncidentState
from autoclusters.core.policy import FaultRule, Policy, Rung, load_policy
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.sandbox import cluster
from autoclusters.sandbox.drivers.demo import incident_since
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from tests.conftest import free_port_base
from tests.helpers import CLI, down_leaving_nothing, eventually

# The fixture's set-up (the sandbox and twelve incidents) counts against the first test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]


@dataclass(frozen=True)
class Fault:
    node: str
    fault: str
    fixed_by: Rung  # the cheapest repair that clears it


R, N = Rung.REBOOT, Rung.REPLACE
# Two at a time: the sandbox's fleet guard repairs two nodes at once and keeps half of the
# four in service; a round ends when both incidents have closed.
ROUNDS = (
    (Fault("gpu-01", "XID_79", R), Fault("gpu-02", "XID_79", N)),
    (Fault("gpu-03", "XID_79", R), Fault("gpu-04", "XID_79", R)),
    (Fault("gpu-01", "XID_48", R), Fault("gpu-02", "XID_79", R)),
    (Fault("gpu-03", "XID_79", N), Fault("gpu-04", "XID_79", R)),
    (Fault("gpu-01", "XID_79", R), Fault("gpu-02", "XID_48", R)),
    (Fault("gpu-03", "XID_79", R), Fault("gpu-04", "XID_79", N)),
)
FAULTS = [f for pair in ROUNDS for f in pair]
XID79 = [f for f in FAULTS if f.fault == "XID_79"]


def live_repairs(f: Fault) -> list[str]:
    """What the live policy (every one of these faults starts at reboot) repairs."""
    return ["reboot"] if f.fixed_by == Rung.REBOOT else ["reboot", "replace"]


@dataclass
class Stored:
    cfg: SandboxConfig
    candidate: Path  # the live policy with XID_79 straight to replace
    incidents: dict[str, Fault]  # incident id -> the fault that opened it


def _dump(policy: Policy) -> str:
    # `ladder` is never written in a policy file (a file that has it pins the figures).
    return yaml.safe_dump(policy.model_dump(mode="json", exclude={"ladder"}), sort_keys=False)


async def _incident(cfg: SandboxConfig, client: Client, f: Fault) -> tuple[str, IncidentState]:
    """Break the node's machine; its agent reports the fault, the API opens the incident,
    the runbook repairs it: returns the incident's id and its end."""
    vm = machine_names.vm_of(cfg, f.node)
    assert vm is not None, f.node
    at = time.time()
    Hardware(cfg.state_dir).inject(
        f.node, vm.vm_id, HardwareFault(fault=f.fault, fixed_by=f.fixed_by)
    )
    opened = await eventually(
        lambda: incident_since(client, cfg.cluster, f.node, at), 60, f"{f.node}'s {f.fault} report"
    )
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    return opened.incident_id, await asyncio.wait_for(handle.result(), 240)


@pytest_asyncio.fixture(scope="module")
async def stored(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stored]:
    cfg = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("replay"), cluster="replay", nodes=4,
        port_base=free_port_base(), boot_delay_s=0,
        # Twelve opens within ten minutes are this test's plan, not a fleet-wide problem.
        breaker_threshold=100,
    )  # fmt: skip
    await asyncio.to_thread(cluster.up, cfg)  # sync: it runs its own event loop
    try:
        # The live policy: the sandbox's, each fault a fresh one (a node's earlier incident
        # would move the next one up a rung, and a reboot-first XID_79 would start at
        # replace). The API reads the file again when it changes.
        live = load_policy(cfg.policy_file).model_copy(update={"recurrence_window_s": 0.001})
        cfg.policy_file.write_text(_dump(live))
        faults = {**live.faults, "XID_79": FaultRule(severity="critical", first_rung=Rung.REPLACE)}
        candidate = cfg.state_dir / "candidate.yaml"
        candidate.write_text(_dump(live.model_copy(update={"faults": faults})))

        client = await temporal.connect(load_file(cfg.settings_file))
        incidents: dict[str, Fault] = {}
        for pair in ROUNDS:
            ends = await asyncio.gather(*(_incident(cfg, client, f) for f in pair))
            for f, (incident_id, state) in zip(pair, ends, strict=True):
                assert state.status == "resolved", (f, state.status, state.error)
                incidents[incident_id] = f

        async def all_closed() -> IncidentHistories | None:
            found = await read_incidents(client, cfg.cluster)
            closed = [r for r in found.records if r.status != "open"]
            return found if len(closed) >= len(FAULTS) else None

        await eventually(all_closed, 30, "the twelve incidents listed, closed")
        yield Stored(cfg=cfg, candidate=candidate, incidents=incidents)
    finally:
        await asyncio.to_thread(down_leaving_nothing, cfg)


def _cli(s: Stored, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `autoclusters` CLI, reading the sandbox's settings (Temporal, cluster,
    policy_file) as an operator's would; wide, so no line of the report wraps."""
    env = {**os.environ, "AUTOCLUSTERS_CONFIG": str(s.cfg.settings_file), "COLUMNS": "250"}
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _blocks(stdout: str, ids: set[str]) -> dict[str, list[str]]:
    """The printed report's per-incident blocks: a line that starts with one of `ids`, then
    its indented lines (the changes)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("  ") and current is not None:
            current.append(line.strip())
        elif line.split(" ", 1)[0] in ids:
            current = blocks.setdefault(line.split(" ", 1)[0], [line])
        else:
            current = None
    return blocks


def test_replay_shows_each_xid79_incident_going_straight_to_replace(stored: Stored) -> None:
    out = _cli(stored, "policy", "replay", str(stored.candidate), "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert (body["cluster"], body["unreadable"]) == ("replay", [])
    diffs = {d["incident_id"]: d for d in body["incidents"]}
    # Every incident the sandbox had is read, and nothing else.
    assert len(body["incidents"]) == len(FAULTS) == 12
    assert diffs.keys() == stored.incidents.keys()
    for incident_id, f in stored.incidents.items():
        d = diffs[incident_id]
        assert (d["node"], d["fault"]) == (f.node, f.fault), d
        assert (d["live"]["rung"], d["live"]["repairs"], d["live"]["outcome"]) == (
            "reboot",
            live_repairs(f),
            "resolved",
        ), d
        if f.fault == "XID_79":
            assert (
                d["candidate"]["rung"],
                d["candidate"]["repairs"],
                d["candidate"]["outcome"],
            ) == ("replace", ["replace"], "resolved"), d
            assert d["changes"] == [
                "rung: reboot -> replace",
                f"repairs: {', '.join(live_repairs(f))} -> replace",
            ], d
            assert d["changed"] and d["notes"] == [], d
        else:
            assert d["candidate"] == d["live"] and not d["changed"], d
    by_reboot = sum(f.fixed_by == Rung.REBOOT for f in XID79)
    sm = body["summary"]
    assert (sm["incidents"], sm["changed"], sm["unknown_outcomes"]) == (12, len(XID79), 0)
    assert (sm["repairs_live"], sm["repairs_candidate"]) == (
        sum(len(live_repairs(f)) for f in FAULTS),
        len(FAULTS),
    )
    assert sm["avoided"] == {"reboot": len(XID79)} and sm["added"] == {"replace": by_reboot}
    assert (sm["breaker_live"], sm["breaker_candidate"], sm["held_live"]) == (0, 0, 0)

    out = _cli(stored, "policy", "replay", str(stored.candidate))
    assert out.returncode == 0, out.stderr
    blocks = _blocks(out.stdout, set(stored.incidents))
    assert blocks.keys() == {i for i, f in stored.incidents.items() if f.fault == "XID_79"}
    for incident_id, lines in blocks.items():
        f = stored.incidents[incident_id]
        assert lines[0].startswith(f"{incident_id} {f.node} XID_79 ("), lines
        assert lines[1:] == [
            "rung: reboot -> replace",
            f"repairs: {', '.join(live_repairs(f))} -> replace",
        ], lines
    text = " ".join(out.stdout.split())
    assert f"{len(XID79)} of 12 incidents change (cluster replay, since " in text
    assert f"repairs avoided: {len(XID79)} reboot; added: {by_reboot} replace" in text


def test_apply_refuses_the_changes_without_accept_changes(stored: Stored) -> None:
    live = stored.cfg.policy_file
    before = live.read_bytes()
    out = _cli(stored, "policy", "apply", str(stored.candidate))
    assert out.returncode == 3, (out.stdout, out.stderr)
    refusal = " ".join(out.stderr.split())
    assert (
        f"not applied: the replay changes {len(XID79)} of 12 incidents; "
        "give --accept-changes to apply it anyway"
    ) in refusal, out.stderr
    assert live.read_bytes() == before  # untouched

    out = _cli(stored, "policy", "apply", str(stored.candidate), "--accept-changes")
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert f"applied: {stored.candidate} -> {live}" in " ".join(out.stdout.split())
    assert live.read_bytes() == stored.candidate.read_bytes() != before
    assert load_policy(live).rule_for("XID_79").first_rung == Rung.REPLACE
