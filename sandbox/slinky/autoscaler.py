"""The sandbox's cluster autoscaler: `kubectl scale nodeset` beyond the NodeSet's Nodes
gets a machine from the NodeSet's node group, and a scale back removes it.

What a cloud's autoscaler does for a node group with a max size, through the Crusoe API as
Crusoe's own does: when a NodeSet's `replicas` rises above its eligible Nodes, the emulated
operator leaves a Pending slurmd pod per missing Node (`operator_pods.new_node_pod`)
and this grows the NodeSet's node group (sandbox/slinky/node_groups.py: the CMK node pool whose
`node_labels` the NodeSet selects, or the Managed Slurm cluster's node set) by the
shortfall, up to `max_nodes` machines (the machines the sandbox has room for). Its new VMs
boot (sandbox/machines/backend.py) and register their Nodes, and the operator gives each a slurmd
pod; on CMK the kubelet declares the Slurm node and starts `slurmd -N` for it
(sandbox/slinky/kubelet.py), on Managed Slurm the configuration lists it and the machine
starts its slurmd. It says so on the Pending pods, as cluster-autoscaler does:
`TriggeredScaleUp`, or `NotTriggerScaleUp` (the group at its max, the cloud refusing, no
group for the NodeSet).

It acts on a rise of `replicas` (kubectl scale), not on every Pending pod: a Node that went
with its machine (a replacement under way) or one the product's `cluster scale` removed
before it lowers `replicas` leaves a Pending pod too, and the group is already being
refilled or shrunk by its owner there.

Scaled back, the operator drains the newest Nodes' Slurm nodes and deletes their pods once
idle; a Node this added that runs no slurmd pod then goes (`NodeGroup.remove`: out of the
pool's count or the configuration, its VM deleted; `ScaleDown` on the Node), which stops its
daemons by PID. What it added is kept in `<state>/k8s/autoscaled.json` across restarts;
nothing it did not add is removed by it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from kubernetes import client
from kubernetes.client import ApiException

from autoclusters.integrations.crusoe import CrusoeClient, load_credentials
from autoclusters.integrations.crusoe.errors import CrusoeError
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import operator_pods as pods
from autoclusters.sandbox.slinky.node_groups import (
    ManagedCloud,
    NodeGroup,
    PoolCloud,
)
from autoclusters.sandbox.slinky.pool_size import max_nodes as max_nodes

log = logging.getLogger(__name__)

Obj = dict[str, Any]
COMPONENT = "cluster-autoscaler"
TIMEOUT_S = 10


def _key(nodeset: Obj) -> str:
    return f"{nodeset['metadata']['namespace']}/{nodeset['metadata']['name']}"


class Cloud(Protocol):
    """Where a NodeSet's machines come from (sandbox/slinky/node_groups.py)."""

    async def group_for(self, selector: dict[str, str], nodes: list[str]) -> NodeGroup | None: ...

    async def group(self, group_id: str) -> NodeGroup | None: ...


class NodePoolAutoscaler:
    def __init__(
        self, api: client.ApiClient, cloud: Cloud, max_nodes: int, state_file: Path
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._cloud = cloud
        self.max_nodes = max_nodes
        self._file = state_file
        saved = self._load()
        # Each NodeSet's replicas as last seen (a rise is a scale request) and the NodeSets
        # whose scale-up is still owed (the cloud refused or was busy: tried again).
        self._replicas: dict[str, int | None] = saved.get("replicas", {})
        self._owed: set[str] = set(saved.get("owed", []))
        self._added: dict[str, str] = saved.get("added", {})  # VM name -> pool id

    def _load(self) -> Obj:
        try:
            doc = json.loads(self._file.read_text())
        except FileNotFoundError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def _save(self) -> None:
        doc = {"replicas": self._replicas, "owed": sorted(self._owed), "added": self._added}
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self._file)

    async def sync(
        self, nodesets: list[Obj], every_pod: list[Obj], nodes: dict[str, Obj]
    ) -> list[str]:
        """One pass after the operator's; returns what it did, one line each."""
        done: list[str] = []
        changed = False
        for nodeset in nodesets:
            key, cap = _key(nodeset), pods.replicas(nodeset)
            seen = self._replicas.get(key, cap)
            if key not in self._replicas or seen != cap:
                self._replicas[key], changed = cap, True
                if cap is not None and (seen is None or cap > seen):
                    self._owed.add(key)
                else:
                    self._owed.discard(key)  # scaled back: nothing more to add
            if key in self._owed:
                waiting = sorted(
                    (p for p in every_pod if pods.owned_by(p, nodeset)
                     and pods.waiting_for_node(p) and not pods.terminating(p)),
                    # As the operator keeps them: the oldest Pending pods stay longest.
                    key=lambda p: (p["metadata"].get("creationTimestamp") or "",
                                   p["metadata"]["name"]),
                )  # fmt: skip
                if await self._scale_up(nodeset, waiting, nodes, done):
                    self._owed.discard(key)
                changed = True
        for line in await self._scale_down(nodesets, every_pod, nodes):
            done.append(line)
            changed = True
        if changed:
            self._save()
        return done

    async def _scale_up(
        self, nodeset: Obj, waiting: list[Obj], nodes: dict[str, Obj], done: list[str]
    ) -> bool:
        """Grow the NodeSet's node group by the Pending pods not already covered by a booting
        machine; True once nothing more is owed (done, or nothing can be done)."""
        if not waiting:
            return True
        selector = pods.node_selector(nodeset)
        mine = [n for n, node in nodes.items() if pods.eligible(node, selector)]
        try:
            group = await self._cloud.group_for(selector, mine)
            if group is None:
                why = f"no node group has the NodeSet's Nodes (node labels {selector})"
                self._tell(waiting, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {why}",
                           warning=True)  # fmt: skip
                done.append(f"{_key(nodeset)}: {why}")
                return True
            booting = [m for m in await group.machines() if m not in nodes]
            need = len(waiting) - len(booting)
            if need <= 0:
                return True
            target = min(group.size + need, self.max_nodes)
            # The pods no Node will come for are the ones the operator keeps (the oldest);
            # a new Node takes the place of the newest.
            short = waiting[: max(need - max(target - group.size, 0), 0)]
            if target > group.size:
                new = await group.grow(target)
                self._added.update({name: group.id for name in new})
                size = f"{{{group.name} {group.size}->{target} (max: {self.max_nodes})}}"
                triggered = waiting[len(short) : len(short) + target - group.size]
                self._tell(triggered, "TriggeredScaleUp", f"pod triggered scale-up: [{size}]")
                done.append(f"{group.name}: {group.size} -> {target} ({', '.join(new)})")
            if short:
                why = f"node group {group.name} is at its max size ({self.max_nodes})"
                self._tell(short, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {why}",
                           warning=True)  # fmt: skip
                done.append(f"{_key(nodeset)}: {len(short)} pod(s) left Pending: {why}")
            return True
        except (CrusoeError, httpx.HTTPError, LookupError) as e:
            # Refused (quota: 403), away, or no machine to copy: said, and tried again.
            self._tell(waiting, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {e}",
                       warning=True)  # fmt: skip
            done.append(f"{_key(nodeset)}: scale-up failed: {e}")
            return getattr(e, "non_retryable", False) is True

    async def _scale_down(
        self, nodesets: list[Obj], every_pod: list[Obj], nodes: dict[str, Obj]
    ) -> list[str]:
        """Remove the Nodes this added that run no slurmd pod because their NodeSet was
        scaled below its Nodes."""
        done: list[str] = []
        running = {pods.node_of(p) for p in every_pod
                   if any(pods.owned_by(p, ns) for ns in nodesets)}  # fmt: skip
        for name, group_id in sorted(self._added.items()):
            node = nodes.get(name)
            if node is None or name in running:
                continue  # still booting (or gone with its machine), or in use
            scaled_in = False
            for ns in nodesets:
                selector, cap = pods.node_selector(ns), pods.replicas(ns)
                eligible = [n for n in nodes.values() if pods.eligible(n, selector)]
                if node in eligible and cap is not None and cap < len(eligible):
                    scaled_in = True
            if not scaled_in:
                continue
            try:
                group = await self._cloud.group(group_id)
                if group is not None:
                    await group.remove(name)
            except (CrusoeError, httpx.HTTPError) as e:
                done.append(f"remove {name}: {e}")
                continue
            del self._added[name]
            self._tell([node], "ScaleDown", "node removed by cluster autoscaler")
            done.append(f"{group.name if group else group_id}: removed {name}")
        return done

    def _tell(self, objs: list[Obj], reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on each object (a pod, a Node), as cluster-autoscaler leaves them; best
        effort: one the API does not take is not worth failing the pass for."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for obj in objs:
            meta = obj["metadata"]
            ns = meta.get("namespace") or "default"
            digest = hashlib.sha256(f"{reason}\0{message}".encode()).hexdigest()[:12]
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{meta['name']}.{digest}", "namespace": ns},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": obj.get("kind") or ("Pod" if meta.get("namespace") else "Node"),
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    **({"namespace": meta["namespace"]} if meta.get("namespace") else {}),
                },
                "reason": reason,
                "message": message,
                "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            try:
                self._core.create_namespaced_event(
                    ns,
                    body,  # type: ignore[arg-type]  # the API's JSON, as it is
                    _request_timeout=TIMEOUT_S,
                )
            except ApiException as e:
                if e.status != 409:  # 409: the same said already
                    log.warning(
                        "no Event %s on %s: %s %s", reason, meta["name"], e.status, e.reason
                    )
            except Exception as e:  # the API away: the pass goes on
                log.warning("no Event %s on %s: %s", reason, meta["name"], e)


def for_sandbox(api: client.ApiClient, cfg: SandboxConfig, max_nodes: int) -> NodePoolAutoscaler:
    """The sandbox's autoscaler: the Crusoe emulator through the sandbox's own credentials
    (one quick retry: a pass must not wait out a long backoff; the next pass tries again);
    node pools on CMK, the Managed Slurm cluster's node sets otherwise."""
    creds = load_credentials(config_path=cfg.crusoe_config)
    crusoe = CrusoeClient(
        credentials=creds, project_id=cfg.crusoe_project, timeout_s=TIMEOUT_S, max_attempts=2,
        backoff_s=0.5, poll_s=0.5,
    )  # fmt: skip
    state = f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/state"
    cloud: Cloud = PoolCloud(crusoe) if cfg.cmk else ManagedCloud(crusoe, state)
    return NodePoolAutoscaler(api, cloud, max_nodes, cfg.state_dir / "k8s" / "autoscaled.json")
