"""Which machine a Slurm node is: its Kubernetes Node, and the cloud VM the repair acts on.

The runbook names a node as Slurm does; the Kubernetes and cloud steps act on that node's
Node and VM, which need not share its name:

- Managed Slurm (and its Kubernetes mode): the Slurm node, its VM and its Node (if any) are
  one name, `gpu-01`. The VM is found by that name, as it always was.
- Slurm as Slinky on CMK (DaemonSet mode): a node pool names its VMs (`np-...-2`), the VM's
  Node is named as the VM, and the Slurm node is the Node's annotation
  `nodeset.slinky.slurm.net/hostname-override` (`gpu-02`). The VM's id is read off the Node:
  `spec.providerID` `crusoe://<vm id>`, the field Crusoe's cloud controller manager sets and
  the API server never lets change (crusoe.md §1.7), else the label `crusoe.ai/instance.id`
  that CMK also sets (and a cluster admin could edit). Both the sandbox's emulator and CMK
  set them; the VM's name is not relied on for the id (CMK Node names, `np-...region.local`,
  need not be the VM's).

Which of the two a cluster is, the cluster itself says: the Node of the Slurm node's own
name is its Node unless its hostname-override names another Slurm node; else the Node whose
hostname-override is the Slurm node's name. No setting chooses. Both the Kubernetes steps
(activities/kubernetes.py) and the cloud steps (activities/cloud.py) ask here.

After a replacement the new VM's Node joins as a new Node object, without the
hostname-override. The slot ledger that provider crusoe-cmk keeps on each NodeSet
(`autoclusters.crusoe.ai/slots`: `{slurm node: {vm, attempt}}`) learns the new VM from the
cloud step that made it (`replaced`), and the Kubernetes step that waits for the new Node
gives the Node of that VM the slot's Slurm name (`new_node`), so Slinky runs its slurmd under
that name. Both writes are resourceVersion-checked and do nothing a second time, so a retried
activity never acts twice. A CMK cluster whose ledger does not track the slot (one this
product did not provision) gets no name on its new Node: the wait for it times out (a gap,
docs/sandbox.md).

Reads that fail are errors (`KubernetesUnavailable`, or the client's `ApiException`), never
"no such Node".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client import ApiException

from autoclusters.activities.kubernetes_calls import (
    TRANSPORT_ERRORS,
    KubernetesUnavailable,
    api_errors,
    call_json,
    items_of,
)
from autoclusters.core.kubernetes import INSTANCE_ID_LABEL, Obj, is_ready, metadata_of
from autoclusters.core.unavailable import Unavailable
from autoclusters.integrations.slinky_crs import (
    ANN_SLOTS,
    HOSTNAME_OVERRIDE,
    NODESET,
    KubeObjects,
    resource_version,
    slots_of,
)

# Where provider crusoe-cmk puts a cluster's Slinky objects (their NodeSets hold the ledger).
SLURM_NAMESPACE = "slurm"
CRUSOE_PROVIDER = "crusoe://"
# A ledger write that lost a race is read and made again this many times per call.
_WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class Machine:
    """A Slurm node's machine as the cloud knows it."""

    slurm_node: str
    vm_name: str  # the VM's name: the Slurm node's own, or (CMK) its Node's
    vm_id: str = ""  # read off the Node on CMK; "": found by name, as on Managed Slurm


def override_of(node: Obj) -> str:
    """The Slurm node a Slinky slurmd on `node` registers as, when not the Node's name."""
    return str((metadata_of(node).get("annotations") or {}).get(HOSTNAME_OVERRIDE) or "")


def vm_id_of(node: Obj) -> str:
    """The VM behind a Node: its providerID's, else its `crusoe.ai/instance.id` label."""
    provider_id = str((node.get("spec") or {}).get("providerID") or "")
    if provider_id.startswith(CRUSOE_PROVIDER):
        return provider_id.removeprefix(CRUSOE_PROVIDER)
    return str((metadata_of(node).get("labels") or {}).get(INSTANCE_ID_LABEL) or "")


def _likeliest(node: Obj) -> tuple[bool, str]:
    # A Ready one first, then the newest: an old Node may linger NotReady while its VM goes.
    return is_ready(node), str(metadata_of(node).get("creationTimestamp", ""))


def node_of(nodes: list[Obj], slurm_node: str) -> Obj | None:
    """The Node of `slurm_node` among `nodes`: the one that carries it as its
    hostname-override (a Ready one first, then the newest), else the one of its own name
    that names no other Slurm node."""
    named = [n for n in nodes if override_of(n) == slurm_node]
    if named:
        return max(named, key=_likeliest)
    own = next((n for n in nodes if metadata_of(n).get("name") == slurm_node), None)
    if own is not None and override_of(own) in ("", slurm_node):
        return own
    return None


def nodes_by_slurm_node(nodes: list[Obj]) -> dict[str, Obj]:
    """Every Slurm node's Node among `nodes`, chosen as `node_of` chooses it, in one pass
    (a cluster of a thousand Nodes is not searched once per node; the API places nodes by
    their Nodes' labels with it, clients/fabric_topology.py)."""
    named: dict[str, Obj] = {}
    own: dict[str, Obj] = {}
    for node in nodes:
        name, override = str(metadata_of(node).get("name") or ""), override_of(node)
        if override and (override not in named or _likeliest(node) > _likeliest(named[override])):
            named[override] = node
        if name and override in ("", name):
            own[name] = node
    return {**own, **named}


@contextmanager
def _outages() -> Iterator[None]:
    """KubeObjects' failures to answer, as the activities' outage."""
    try:
        yield
    except TRANSPORT_ERRORS as e:
        raise KubernetesUnavailable(f"{type(e).__name__}: {e}") from e
    except Unavailable as e:
        if isinstance(e, KubernetesUnavailable):
            raise
        raise KubernetesUnavailable(str(e)) from e


class MachineOf:
    """Slurm node -> Kubernetes Node and VM, read from the cluster at each call.

    Args:
        api: the cluster's Kubernetes API; None: no Kubernetes, every name is the Slurm
            node's (Managed Slurm without a kubeconfig).
        namespace: where the NodeSets that keep the slot ledger are.
    """

    def __init__(
        self,
        api: client.ApiClient | None,
        *,
        namespace: str = SLURM_NAMESPACE,
        request_timeout_s: float = 30,
    ) -> None:
        self._core = client.CoreV1Api(api) if api is not None else None
        self._kube = KubeObjects(api, namespace, timeout_s=request_timeout_s) if api else None
        self._timeout = request_timeout_s

    async def _nodes(self) -> list[Obj]:
        assert self._core is not None
        doc = await call_json(self._core.list_node, timeout_s=self._timeout)
        return items_of(doc, "nodes")

    async def _read(self, name: str) -> Obj | None:
        assert self._core is not None
        try:
            return await call_json(self._core.read_node, name, timeout_s=self._timeout)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def kube_node(self, slurm_node: str) -> Obj | None:
        """The Node of `slurm_node` (None: no Node is it). Without Kubernetes: None.

        The Node of its own name is read first (one read, where Managed Slurm names it so);
        only when that is not it are all Nodes listed for the one that carries its name. A
        Slurm node's name is not a CMK Node's (`np-...`), so a Node of that name that names
        no other Slurm node is taken as it."""
        if self._core is None:
            return None
        own = await self._read(slurm_node)
        if own is not None and override_of(own) in ("", slurm_node):
            return own
        return node_of(await self._nodes(), slurm_node)

    async def of(self, slurm_node: str) -> Machine:
        """The VM of `slurm_node`: on CMK its Node's (name and id), else its own name."""
        node = await self.kube_node(slurm_node)
        if node is None or override_of(node) != slurm_node:
            return Machine(slurm_node=slurm_node, vm_name=slurm_node)
        name = metadata_of(node)["name"]
        return Machine(slurm_node=slurm_node, vm_name=name, vm_id=vm_id_of(node))

    # --- for the cloud steps (activities/cloud.py `Machines`) ------------------------------

    async def vm_of(self, slurm_node: str) -> tuple[str, str]:
        """`of`'s VM name and id, its failures as the workflow reads them."""
        with api_errors():
            machine = await self.of(slurm_node)
        return machine.vm_name, machine.vm_id

    async def record_replacement(self, slurm_node: str, old_vm_id: str, new_vm_id: str) -> None:
        """`replaced`, its failures as the workflow reads them."""
        with api_errors():
            await self.replaced(slurm_node, old_vm_id, new_vm_id)

    # --- the slot ledger ------------------------------------------------------------------

    async def _nodesets(self) -> list[Obj]:
        """The NodeSets that may keep a ledger; none where Slinky's CRDs are not installed."""
        if self._kube is None:
            return []
        try:
            with _outages():
                return await self._kube.list(NODESET, "")
        except ApiException as e:
            if e.status == 404:  # no NodeSet kind (or namespace) here: no ledger
                return []
            raise

    async def ledger_vm(self, slurm_node: str) -> str:
        """The VM the slot ledger says `slurm_node` holds ("": no ledger tracks it)."""
        for cr in await self._nodesets():
            slot = slots_of(cr).get(slurm_node)
            if isinstance(slot, dict) and slot.get("vm"):
                return str(slot["vm"])
        return ""

    async def replaced(self, slurm_node: str, old_vm_id: str, new_vm_id: str) -> bool:
        """A replacement gave `slurm_node` the VM `new_vm_id`: the ledger's slot that held
        `old_vm_id` holds it now. True when a ledger tracks the slot (written now or
        before); False when none does."""
        if old_vm_id == new_vm_id:
            return False
        for _ in range(_WRITE_ATTEMPTS):
            for cr in await self._nodesets():
                slots = slots_of(cr)
                slot = slots.get(slurm_node)
                if not isinstance(slot, dict):
                    continue
                if slot.get("vm") == new_vm_id:
                    return True  # a retry: written already
                if slot.get("vm") != old_vm_id:
                    continue  # the slot holds another machine now: not ours to move
                slots[slurm_node] = {**slot, "vm": new_vm_id}
                if await self._write_ledger(cr, slots):
                    return True
                break  # someone wrote first: read again
            else:
                return False
        raise KubernetesUnavailable(
            f"the slot ledger of {slurm_node} kept changing under {_WRITE_ATTEMPTS} writes"
        )

    async def _write_ledger(self, cr: Obj, slots: dict[str, object]) -> bool:
        assert self._kube is not None
        patch = {
            "metadata": {
                "resourceVersion": resource_version(cr),
                "annotations": {ANN_SLOTS: json.dumps(slots, sort_keys=True)},
            }
        }
        try:
            with _outages():
                await self._kube.patch(NODESET, cr["metadata"]["name"], patch)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    # --- a replacement's new Node ---------------------------------------------------------

    async def new_node(self, slurm_node: str, old_provider_id: str) -> Obj | None:
        """The Node of `slurm_node` while its machine comes back (None: not registered).

        The Node carrying its name, unless that is the old machine's and the ledger says
        the slot holds another VM now: then the Node of that VM, given the slot's name
        (once: a Node that carries it already is left as it is; one that carries another
        Slurm node's is not taken)."""
        found = await self.kube_node(slurm_node)
        old_vm = old_provider_id.removeprefix(CRUSOE_PROVIDER) if old_provider_id else ""
        if found is not None and (not old_vm or vm_id_of(found) != old_vm):
            return found  # a new machine (or nothing to compare with)
        vm = await self.ledger_vm(slurm_node)
        if not vm or vm == old_vm:
            return found  # the old machine's (a reboot's), or none yet
        candidate = next((n for n in await self._nodes() if vm_id_of(n) == vm), None)
        if candidate is None or override_of(candidate) not in ("", slurm_node):
            return found
        if override_of(candidate) == slurm_node:
            return candidate
        return await self._give_name(candidate, slurm_node)

    async def _give_name(self, node: Obj, slurm_node: str) -> Obj | None:
        """Annotate the Node with the slot's Slurm name, checked against the read it was
        decided on (None: someone wrote in between; the next poll decides again)."""
        assert self._core is not None
        meta = metadata_of(node)
        patch = {
            "metadata": {
                "resourceVersion": str(meta.get("resourceVersion", "")),
                "annotations": {HOSTNAME_OVERRIDE: slurm_node},
            }
        }
        try:
            return await call_json(
                self._core.patch_node, meta["name"], patch, timeout_s=self._timeout
            )
        except ApiException as e:
            if e.status in (404, 409):  # gone, or changed: decide again on the next read
                return None
            raise
