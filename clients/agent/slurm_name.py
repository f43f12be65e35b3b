"""Which Slurm node this agent's machine is, where Slurm runs in Kubernetes (Slinky).

The DaemonSet tells the agent its Kubernetes Node (`spec.nodeName`). Slinky's slurmd on that
Node registers as the Node's `nodeset.slinky.slurm.net/hostname-override` annotation when it
has one (on CMK a pool's VM `np-...-2` runs Slurm node `gpu-02`), else as the Node's name;
the runbook, the faults and the series name the Slurm node, so the agent reports as that.
The downward API cannot hand a pod a Node's annotation, hence this read.

A replacement's Node is given its slot's Slurm name by the runbook a little after it joins
(activities/machine_of.py): until the Node carries an override the agent looks again,
backing off from `first_s` to `max_s`, and once the name changes it stops, so that its pod
starts again under the new name (its state and spool are per Slurm node). An override,
once set, is not looked at again. A Node that cannot be read is never taken for one
without the annotation: the agent waits and says why.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from autoclusters.integrations.slinky_crs import HOSTNAME_OVERRIDE

log = logging.getLogger(__name__)


def slurm_name_of(node: Any) -> str:
    """The Slurm node Slinky runs on this Node (a `V1Node`)."""
    annotations = node.metadata.annotations or {}
    return str(annotations.get(HOSTNAME_OVERRIDE) or node.metadata.name)


class SlurmName:
    def __init__(
        self,
        api_client: Any,
        node: str,
        *,
        first_s: float = 2.0,
        max_s: float = 300.0,
        request_timeout_s: float = 10.0,
    ) -> None:
        from kubernetes import client

        self.node = node  # the Kubernetes Node's name
        self._core = client.CoreV1Api(api_client)
        self._first_s, self._max_s = first_s, max_s
        self._timeout = request_timeout_s

    def read(self) -> str:
        """One read of the Node; its failure raises."""
        return slurm_name_of(self._core.read_node(self.node, _request_timeout=self._timeout))

    def wait_read(self, stop: threading.Event) -> str | None:
        """`read`, again after each failure (backing off) until it answers; None: stopped."""
        delay = self._first_s
        while not stop.is_set():
            try:
                return self.read()
            except Exception as e:
                log.warning(
                    "cannot read Kubernetes Node %s for its Slurm name (again in %.0f s): %s",
                    self.node, delay, e,
                )  # fmt: skip
            stop.wait(delay)
            delay = min(delay * 2, self._max_s)
        return None

    def follow(self, current: str, stop: threading.Event, on_change: Callable[[str], None]) -> None:
        """Until `stop`, while the Node carries no override: look again, backing off, and
        call `on_change(name)` once the Slurm name is no longer `current`."""
        delay = self._first_s
        while current == self.node and not stop.wait(delay):
            delay = min(delay * 2, self._max_s)
            try:
                name = self.read()
            except Exception as e:
                log.warning("cannot read Kubernetes Node %s for its Slurm name: %s", self.node, e)
                continue
            if name != current:
                on_change(name)
                return
