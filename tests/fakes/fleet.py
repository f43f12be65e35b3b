"""A synthetic fleet of N nodes for the console (its tests and bench/console.py): what the
console's `ConsoleSource` reads, made up deterministically from a seed, no sandbox.

Layout: leaves of 32 nodes, 16 leaves to a pod (512 nodes); node sets `training`,
`inference` (the last pod's first two leaves) and `spares` (one node in 64). About 1 % of
the nodes have an open incident (some waiting for approval, some repairing), a few are
drained by hand, down, or lent to inference, as a real fleet's would be.

Slurm's answer is kept as `sinfo --json` text with the fields Slurm 22.05 prints, and each
read parses it with the product's own parser: the API pays what it pays for a real sinfo
(less the process). `read_s` makes every read take that long (sinfo and Temporal's round
trips), without using CPU.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from autoclusters.clients.console.sources import IncidentRead
from autoclusters.clients.incidents import IncidentNotFound, IncidentSummary
from autoclusters.clients.systemic_incidents import SystemicRead
from autoclusters.core.cluster import ClusterState, Placement, render_topology
from autoclusters.core.guard import GuardState, GuardStatus
from autoclusters.core.ladder_figures import LadderFigures, RungFigures
from autoclusters.core.models import (
    SPARE_REASON,
    IncidentRequest,
    IncidentState,
    SlurmNode,
    StepRecord,
    Waiting,
)
from autoclusters.core.policy import GuardPolicy
from autoclusters.core.sharing import LENT_REASON
from autoclusters.core.systemic import SystemicState
from autoclusters.integrations.slurm import parse_nodes

LEAF_NODES = 32
POD_LEAVES = 16
FAULTS = ["XID_79", "XID_48", "XID_94", "ECC_DBE", "NVLINK_DOWN", "IB_LINK_DOWN"]
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def node_name(i: int) -> str:
    return f"gpu-{i + 1:04d}"


def placement(i: int) -> tuple[str, str]:
    leaf = i // LEAF_NODES
    return f"pod-{leaf // POD_LEAVES + 1}", f"leaf-{leaf + 1:03d}"


def sinfo_node(name: str, state: list[str], reason: str, allocated: bool) -> dict[str, Any]:
    """One node as `sinfo --json` (22.05) prints it."""
    return {
        "architecture": "x86_64", "burstbuffer_network_address": "", "boards": 1,
        "boot_time": 1764590000, "comment": "", "cores": 56, "cpu_binding": 0,
        "cpu_load": 1200 if allocated else 3, "extra": "", "free_memory": 1800000,
        "cpus": 224, "last_busy": 1764590400, "features": "h100,ib", "active_features": "h100,ib",
        "gres": "gpu:h100:8", "gres_drained": "N/A",
        "gres_used": "gpu:h100:8(IDX:0-7)" if allocated else "gpu:h100:0(IDX:N/A)",
        "mcs_label": "", "name": name, "next_state_after_reboot": "invalid",
        "address": name, "hostname": name, "state": state[0].lower(), "state_flags": state[1:],
        "next_state_after_reboot_flags": [], "operating_system": "Linux 6.8.0-49-generic",
        "owner": None, "partitions": ["gpu"], "port": 6818, "real_memory": 2000000,
        "reason": reason, "reason_changed_at": 1764590000 if reason else 0,
        "reason_set_by_user": "root" if reason else "", "slurmd_start_time": 1764590100,
        "sockets": 2, "threads": 2, "temporary_disk": 0, "weight": 1,
        "tres": "cpu=224,mem=2000000M,billing=224,gres/gpu=8", "slurmd_version": "22.05.8",
        "alloc_memory": 1500000 if allocated else 0, "alloc_cpus": 224 if allocated else 0,
        "idle_cpus": 0 if allocated else 224,
        "tres_used": "cpu=224,gres/gpu=8" if allocated else None, "tres_weighted": 224.0,
    }  # fmt: skip


def incident(node: str, fault: str, step: str, waiting: Waiting | None) -> IncidentState:
    req = IncidentRequest(
        incident_id=f"inc-20261201-120000-{node}",
        cluster="c1",
        node=node,
        fault=fault,
        opened_at=T0,
        opened_by="agent",
    )
    steps = [
        StepRecord(name=s, started_at=T0 + timedelta(seconds=i), outcome="ok",
                   finished_at=T0 + timedelta(seconds=i + 1))
        for i, s in enumerate(["guard_register", "notify_opened", "drain", "requeue"])
    ]  # fmt: skip
    return IncidentState(request=req, current_step=step, waiting_for=waiting, steps=steps)


def timeline(opened: datetime, plan: list[tuple[str, float, str]]) -> list[StepRecord]:
    """Steps one after the other from `opened`: (name, seconds, outcome) each."""
    steps, at = [], opened
    for name, seconds, outcome in plan:
        done = at + timedelta(seconds=seconds)
        steps.append(StepRecord(name=name, started_at=at, finished_at=done, outcome=outcome))  # type: ignore[arg-type]
        at = done
    return steps


class FleetSource:
    """The console's source for a made-up fleet of `nodes` nodes (see the module's doc)."""

    def __init__(
        self, nodes: int, *, seed: int = 1, read_s: float = 0.0, churn: bool = False
    ) -> None:
        self.read_s = read_s
        # Churn: every read finds one in-service node's job ended or a new one started, as
        # a busy fleet's sinfo would (so no two reads answer the same).
        self.churn = churn
        self._rng = random.Random(seed + 1)
        self.reads = 0  # how many times Slurm was read (one per cluster read)
        self.names = [node_name(i) for i in range(nodes)]
        rng = random.Random(seed)
        self.sets: dict[str, list[str]] = {"training": [], "inference": [], "spares": []}
        self.slurm: dict[str, dict[str, Any]] = {}
        self.open: dict[str, IncidentState] = {}
        self.closed: list[IncidentState] = []  # add_history()
        # What `ladder()` answers (add_history() tallies it); an exception is raised.
        self.ladder_figures: LadderFigures | Exception = LadderFigures()
        last_pod = placement(nodes - 1)[0]
        for i, name in enumerate(self.names):
            pod, leaf = placement(i)
            leaf_in_pod = (i // LEAF_NODES) % POD_LEAVES
            if i % 64 == 63:
                self.sets["spares"].append(name)
                self.slurm[name] = sinfo_node(name, ["IDLE", "DRAIN"], SPARE_REASON, False)
                continue
            inference = pod == last_pod and leaf_in_pod < 2 and nodes > LEAF_NODES * 2
            self.sets["inference" if inference else "training"].append(name)
            roll = rng.random()
            if inference and roll < 0.5:
                self.slurm[name] = sinfo_node(name, ["IDLE", "DRAIN"], LENT_REASON, False)
            elif roll < 0.010:
                self.add_incident(name, FAULTS[rng.randrange(len(FAULTS))], rng.random())
            elif roll < 0.015:
                self.slurm[name] = sinfo_node(
                    name, ["MIXED", "DRAIN"], "by hand: fan noise, RMA ticket 4121", True
                )
            elif roll < 0.018:
                down = ["DOWN", "NOT_RESPONDING"]
                self.slurm[name] = sinfo_node(name, down, "Not responding", False)
            else:
                self.slurm[name] = sinfo_node(name, ["ALLOCATED"], "", True)
        self._encoded: dict[str, str] = {}
        self._cluster: ClusterState | None = None
        self._dump()

    def add_incident(self, name: str, fault: str, kind: float = 0.9) -> None:
        """Open an incident on `name` (its node drained by us) as the runbook would."""
        waiting = Waiting(kind="approval", step="replace", since=T0) if kind < 0.2 else None
        step = "approval" if waiting else ("repair" if kind < 0.5 else "health_gate")
        self.open[name] = incident(name, fault, step, waiting)
        reason = f"autoclusters: inc-20261201-120000-{name} {fault}"
        self.slurm[name] = sinfo_node(name, ["IDLE", "DRAIN"], reason, False)
        if len(self.slurm) == len(self.names):
            self._dump(name)

    def close_incident(self, name: str) -> None:
        self.open.pop(name, None)
        self.slurm[name] = sinfo_node(name, ["ALLOCATED"], "", True)
        self._dump(name)

    def _dump(self, *names: str) -> None:
        # Each node's JSON is kept encoded: a change re-encodes that node only, so the fake
        # spends no more of the API's CPU than the parse a real sinfo costs it.
        for n in names or self.slurm:
            self._encoded[n] = json.dumps(self.slurm[n])

    def _sinfo(self) -> str:
        return '{"nodes": [' + ", ".join(self._encoded[n] for n in self.names) + "]}"

    def _turn_over(self) -> None:
        name = self.names[self._rng.randrange(len(self.names))]
        node = self.slurm[name]
        if node["state"] in ("allocated", "idle") and not node["state_flags"]:
            busy = node["state"] == "idle"
            self.slurm[name] = sinfo_node(name, ["ALLOCATED" if busy else "IDLE"], "", busy)
            self._dump(name)

    async def _wait(self) -> None:
        if self.read_s:
            await asyncio.sleep(self.read_s)

    async def slurm_nodes(self) -> list[SlurmNode]:
        self.reads += 1
        if self.churn:
            self._turn_over()
        await self._wait()
        return parse_nodes(json.loads(self._sinfo()))

    async def cluster(self) -> ClusterState | None:
        await self._wait()
        if self._cluster is None:  # what the provisioning workflow holds: made once
            placements = [
                Placement(node=n, pod=placement(i)[0], leaf=placement(i)[1])
                for i, n in enumerate(self.names)
            ]
            self._cluster = ClusterState(
                cluster="c1",
                provider="sandbox",
                node_sets={k: v for k, v in self.sets.items() if v},
                topology_conf=render_topology(placements),
            )
        return self._cluster.model_copy(deep=True)

    async def guard(self) -> GuardStatus | None:
        await self._wait()
        repairing = {n: i.request.incident_id for n, i in self.open.items()
                     if i.current_step == "repair"}  # fmt: skip
        spares = self.sets["spares"][: max(1, len(self.sets["spares"]) // 2)]
        state = GuardState(spares=spares, repairing=repairing)
        return GuardStatus(cluster="c1", policy=GuardPolicy(), state=state)

    async def open_incidents(self) -> list[IncidentState]:
        await self._wait()
        return list(self.open.values())

    def _summary(self, i: IncidentState) -> IncidentSummary:
        return IncidentSummary(
            incident_id=i.request.incident_id,
            node=i.request.node,
            fault=i.request.fault,
            workflow_id=f"remediation-c1-{i.request.node}",
            status="running",
            state="open",
            started_at=T0,
            closed_at=None,
        )

    async def incidents(
        self, *, node: str | None, state: str | None, limit: int
    ) -> list[IncidentSummary]:
        rows = [self._summary(i) for i in self.open.values()]
        return [r for r in rows if node in (None, r.node)][:limit]

    async def incident(self, incident_id: str) -> IncidentRead:
        for i in self.open.values():
            if i.request.incident_id == incident_id:
                wf = f"remediation-c1-{i.request.node}"
                return IncidentRead(state=i, workflow_id=wf, temporal_status="running")
        raise IncidentNotFound(f"no incident {incident_id}")

    async def recent_states(self, limit: int) -> list[IncidentState]:
        return [*self.open.values(), *self.closed][:limit]

    async def systemic_incidents(self) -> list[SystemicState]:
        return []  # the made-up fleet's faults are each one node's

    async def systemic(self, incident_id: str) -> SystemicRead:
        raise IncidentNotFound(f"no systemic incident {incident_id}")

    def add_history(self, days: int = 10, per_day: int = 6, now: datetime | None = None) -> None:
        """Closed incidents over the last `days` (the fleet page's figures): each drained,
        requeued its jobs, repaired on a rung, gated (most pass) and returned or replaced
        by a spare."""
        rng = random.Random(7)
        end = now or datetime.now(UTC)
        rungs = {"reboot": (240, 0.9), "reset": (600, 0.8), "replace": (1800, 0.95)}
        for d in range(days):
            for k in range(rng.randint(per_day // 2, per_day * 3 // 2)):
                node = self.names[rng.randrange(len(self.names))]
                fault = FAULTS[rng.randrange(len(FAULTS))]
                rung = list(rungs)[rng.randrange(3)]
                took, pass_rate = rungs[rung]
                opened = end - timedelta(days=d, hours=rng.uniform(0.5, 23))
                req = IncidentRequest(
                    incident_id=f"inc-{opened:%Y%m%d-%H%M%S}-{node}-{k}", cluster="c1",
                    node=node, fault=fault, opened_at=opened, opened_by="agent",
                )  # fmt: skip
                passed = rng.random() < pass_rate
                spare = rung == "replace" and rng.random() < 0.5
                plan = [("guard_register", 0.2, "ok"), ("drain", 1.5, "ok"),
                        ("requeue", rng.uniform(1, 6), "ok")]  # fmt: skip
                if spare:
                    plan.append(("take_spare", rng.uniform(20, 60), "ok"))
                plan.append(("repair", took * rng.uniform(0.7, 1.5), "ok"))
                plan.append(("health_gate", rng.uniform(30, 90), "ok" if passed else "failed"))
                if passed:
                    plan.append(("return_to_service", 2, "ok"))
                steps = timeline(opened, plan)
                self.closed.append(IncidentState(
                    request=req, status="resolved" if passed else "failed", rung=rung,
                    steps=steps, requeued_jobs=[rng.randint(100, 999)],
                    spare_node=self.sets["spares"][0] if spare and self.sets["spares"] else None,
                    closed_at=steps[-1].finished_at,
                ))  # fmt: skip

        self.ladder_figures = self._tally()

    def _tally(self) -> LadderFigures:
        """The closed incidents' repairs per (fault, rung) and how many passed their gate
        (the fake's stand-in for the history reader's figures)."""
        tally: dict[tuple[str, str], list[int]] = {}
        for s in self.closed:
            gate = next((st for st in s.steps if st.name == "health_gate"), None)
            if gate is None or s.rung is None:
                continue
            rung = "reset_gpu" if s.rung == "reset" else s.rung
            row = tally.setdefault((s.request.fault, rung), [0, 0])
            row[0] += 1
            row[1] += gate.outcome == "ok"
        rows = [RungFigures(fault=f, rung=r, attempts=n, successes=ok)
                for (f, r), (n, ok) in sorted(tally.items())]  # fmt: skip
        return LadderFigures(as_of=datetime.now(UTC), incidents=len(self.closed), rows=rows)

    async def ladder(self) -> LadderFigures:
        if isinstance(self.ladder_figures, Exception):
            raise self.ladder_figures
        return self.ladder_figures

    async def kubernetes_node(self, node: str) -> dict[str, str] | None:
        return None
