"""Policy replay, `stats ladder` and the ladder at open against a real Temporal dev server:
incidents run on it (the workflow tests' in-memory cluster), then are read back through
the visibility list and each run's history, the way the commands read a cluster's.

Aspects covered:
- the incidents read back from Temporal (by Cluster, within --since) with their repairs;
- reading touches nothing: each history has the same events before and after;
- `policy replay` shows the per-incident diff of a policy raising XID_79 to replace, and
  `policy apply` refuses it (exit 3, the policy file untouched) without --accept-changes;
- `stats ladder --json` counts the reboots that failed and the replaces that held;
- an incident opened with a skipping policy gets the figures (LadderAtOpen) and opens on
  replace, saying why: the whole loop from history to decision;
- a node's repairs counted for the lemon check, by node.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner, Result

from autoclusters.clients.cli.app import app
from autoclusters.clients.incident_history import (
    IncidentHistories,
    LadderAtOpen,
    read_incidents,
    repairs_before,
)
from autoclusters.core.models import IncidentRequest, IncidentState, workflow_id
from autoclusters.core.policy import FaultRule, Policy, Rung
from autoclusters.integrations import temporal
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import (
    dev_server_env,  # noqa: F401  (this module's `env`: a dev server)
    eventually,
)
from tests.workflows.test_remediation_workflow import EXECUTION_TIMEOUT, Fleet, _fleet, _policy

pytestmark = pytest.mark.integration  # a Temporal dev server of its own


async def _run(f: Fleet, req: IncidentRequest) -> IncidentState:
    """Start the incident as the API does (its search attributes), wait for its end."""
    f.started.append(workflow_id(req.cluster, req.node))
    handle = await f.env.client.start_workflow(
        NodeRemediation.run,
        req,
        id=workflow_id(req.cluster, req.node),
        task_queue=f.task_queue,
        execution_timeout=EXECUTION_TIMEOUT,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, req.incident_id),
                SearchAttributePair(temporal.CLUSTER, req.cluster),
                SearchAttributePair(temporal.NODE, req.node),
                SearchAttributePair(temporal.FAULT, req.fault),
            ]
        ),
    )
    return await handle.result()


def _cli(monkeypatch: pytest.MonkeyPatch, env: WorkflowEnvironment, f: Fleet, *args: str) -> Result:
    monkeypatch.setenv(
        "AUTOCLUSTERS_TEMPORAL__ADDRESS", env.client.service_client.config.target_host
    )
    monkeypatch.setenv("AUTOCLUSTERS_CLUSTER", f.cluster)
    return CliRunner().invoke(app, list(args))


def _write(path: Path, policy: Policy) -> Path:
    path.write_text(yaml.safe_dump(policy.model_dump(mode="json", exclude={"ladder"})))
    return path


async def test_replay_and_the_ladder_from_temporal(
    env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _fleet(env, nodes=3, fixed_by=Rung.REPLACE) as f:
        done = [await _run(f, f.request(node=n)) for n in ("gpu-01", "gpu-02")]
        assert [(s.status, s.repair_attempts) for s in done] == [("resolved", 2)] * 2

        async def both() -> IncidentHistories | None:
            found = await read_incidents(env.client, f.cluster)
            return found if len(found.records) == 2 else None

        found = await eventually(both, what="both incidents listed")
        assert [[a.rung for a in r.repairs] for r in found.records] == [
            [Rung.REBOOT, Rung.REPLACE]
        ] * 2
        ids = [workflow_id(f.cluster, n) for n in ("gpu-01", "gpu-02")]

        async def events() -> list[int]:
            handles = [env.client.get_workflow_handle(i) for i in ids]
            return [len((await h.fetch_history()).events) for h in handles]

        before = await events()

        live = _write(tmp_path / "live.yaml", _policy())
        monkeypatch.setenv("AUTOCLUSTERS_POLICY_FILE", str(live))
        raised = _policy(
            faults={
                **_policy().faults,
                "XID_79": FaultRule(severity="critical", first_rung=Rung.REPLACE),
            }
        )
        cand = _write(tmp_path / "cand.yaml", raised)
        out = await asyncio.to_thread(_cli, monkeypatch, env, f, "policy", "replay", str(cand))
        assert out.exit_code == 0, out.output
        text = " ".join(out.stdout.split())
        assert text.count("repairs: reboot, replace -> replace") == 2
        assert "2 of 2 incidents change" in text and "repairs avoided: 2 reboot" in text
        before_file = live.read_text()
        out = await asyncio.to_thread(_cli, monkeypatch, env, f, "policy", "apply", str(cand))
        assert out.exit_code == 3, out.output
        assert live.read_text() == before_file

        out = await asyncio.to_thread(_cli, monkeypatch, env, f, "stats", "ladder", "--json")
        assert out.exit_code == 0, out.output
        rows = {(r["fault"], r["rung"]): r for r in json.loads(out.stdout)["rows"]}
        assert (
            rows[("XID_79", "reboot")]["attempts"],
            rows[("XID_79", "reboot")]["successes"],
        ) == (2, 0)
        assert (
            rows[("XID_79", "replace")]["attempts"],
            rows[("XID_79", "replace")]["successes"],
        ) == (2, 2)

        assert await events() == before  # read, never touched

        # The loop closed: an incident opened under a skipping policy skips the reboot.
        skipping = _policy(skip_rung_below=0.2, min_samples=2)
        snapshot = await LadderAtOpen(env.client).policy_for_open(f.cluster, skipping)
        third = await _run(f, f.request(node="gpu-03", policy=snapshot))
        why = "reboot fixed XID_79 in 0 of 2 cases: going to replace"
        assert (third.status, third.repair_attempts, third.rung) == ("resolved", 1, "replace")
        assert [s.detail for s in third.steps if s.name == "skip_rung"] == [why]
        assert why in f.notes("gpu-03")[0].text


async def test_a_nodes_repairs_are_counted_for_the_lemon_check(env: WorkflowEnvironment) -> None:
    """The lemon count at open (core/lemon.py): the node's own incidents that repaired it,
    read by its Node search attribute; another node's, and a check that is off, count none."""
    async with _fleet(env, nodes=3, fixed_by=Rung.REBOOT) as f:
        for node in ("gpu-01", "gpu-01", "gpu-02"):
            assert (await _run(f, f.request(node=node))).status == "resolved"
        lemons = _policy(lemon_repairs=3)

        async def counted() -> int | None:
            n = await repairs_before(env.client, f.cluster, "gpu-01", lemons)
            return n if n == 2 else None  # visibility catches up with the closes

        assert await eventually(counted, what="gpu-01's two repairs") == 2
        assert await repairs_before(env.client, f.cluster, "gpu-03", lemons) == 0
        assert await repairs_before(env.client, f.cluster, "gpu-01", _policy()) is None
