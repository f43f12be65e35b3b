"""A CMK node pool's lock and slot ledger, kept on the node set's NodeSet (cmk.py says how
slots use them): the annotation `autoclusters.crusoe.ai/pool-lock` {holder, until} and the
ledger `autoclusters.crusoe.ai/slots` {node: {vm, attempt}}.

Every write is resourceVersion-checked, so two writers never both win: a 409 is "someone
else wrote first; read again", never an error. A lock whose holder stops renewing it
expires after `lock_ttl_s` (a dead worker's), and a retry of the same activity holds it
under the same holder id, so it resumes at once.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.integrations.slinky_crs import (
    ANN_POOL_LOCK,
    ANN_SLOTS,
    NODESET,
    KubeObjects,
    Obj,
    resource_version,
)


class PoolLedger:
    """The pool lock and slot ledger of the NodeSets in `kube`'s namespace.

    Args:
        kube: the CMK cluster's objects in the namespace Slurm lives in.
        lock_ttl_s: how long a pool lock holds when its holder stops renewing it.
    """

    def __init__(self, kube: KubeObjects, *, lock_ttl_s: float) -> None:
        self._kube = kube
        self._lock_ttl_s = lock_ttl_s

    async def nodeset(self, name: str) -> Obj:
        cr = await self._kube.get(NODESET, name)
        if cr is None:
            raise ApplicationError(f"NodeSet {name} is gone", type="NodeSetGone")
        return cr

    async def lock(self, cr: Obj, holder: str) -> bool:
        """Take (or renew) the NodeSet's pool lock; False: another holder has it, or wrote
        first."""
        lock = lock_of(cr)
        if lock and lock.get("holder") != holder and float(lock.get("until", 0)) > time.time():
            return False
        value = json.dumps({"holder": holder, "until": time.time() + self._lock_ttl_s})
        try:
            await self._kube.patch(
                NODESET,
                cr["metadata"]["name"],
                {
                    "metadata": {
                        "resourceVersion": resource_version(cr),
                        "annotations": {ANN_POOL_LOCK: value},
                    }
                },
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    async def renew(self, name: str, holder: str) -> None:
        cr = await self.nodeset(name)
        if holds(cr, holder):
            await self.lock(cr, holder)

    async def write(self, cr: Obj, slots: dict[str, Any], *, lock: str | None) -> bool:
        """The ledger (and the NodeSet's `replicas`: its slots), resourceVersion-checked;
        `lock` None releases the lock with it, a holder leaves it as it is. False: someone
        wrote first."""
        annotations: dict[str, Any] = {ANN_SLOTS: json.dumps(slots, sort_keys=True)}
        if lock is None:
            annotations[ANN_POOL_LOCK] = None
        try:
            await self._kube.patch(
                NODESET,
                cr["metadata"]["name"],
                {
                    "metadata": {
                        "resourceVersion": resource_version(cr),
                        "annotations": annotations,
                    },
                    "spec": {"replicas": len(slots)},
                },
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    async def unlock(self, name: str, holder: str) -> None:
        """Best effort: release the lock if still ours (else it expires)."""
        try:
            cr = await self._kube.get(NODESET, name)
            if cr is not None and holds(cr, holder):
                await self._kube.patch(
                    NODESET,
                    name,
                    {
                        "metadata": {
                            "resourceVersion": resource_version(cr),
                            "annotations": {ANN_POOL_LOCK: None},
                        }
                    },
                )
        except (ApiException, urllib3.exceptions.HTTPError):
            pass  # the original error matters more; an unreleased lock expires


def lock_of(cr: Obj) -> dict[str, Any]:
    raw = (cr.get("metadata", {}).get("annotations") or {}).get(ANN_POOL_LOCK)
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def holds(cr: Obj, holder: str) -> bool:
    return lock_of(cr).get("holder") == holder


def lock_holder() -> str:
    """Who takes a pool lock: this activity of this workflow run, so that its retry (same
    ids) resumes under the lock a lost try held."""
    if activity.in_activity():
        info = activity.info()
        return f"{info.workflow_run_id}/{info.activity_id}"
    return f"local/{uuid.uuid4()}"
