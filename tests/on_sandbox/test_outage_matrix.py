"""The outage matrix, on real Slurm-on-Kubernetes sandboxes (Crusoe emulator included; shared
with the chaos matrix: tests/matrix_sandbox.py):
each dependency of the runbook (slurmctld, the Kubernetes and Crusoe APIs, Slack, Temporal,
and the alert path: Prometheus, Alertmanager, the API) is taken away for OUTAGE_S once a
step that uses it has started (sandbox/drivers/outage_matrix.py `USED_AT`: pairs where the step does
not use the component are left out). The machine's GPU is really broken until a reboot.
For the early steps (drain, requeue, wait_idle) a `--no-requeue` job holds the node and
ends by itself a while after the outage starts, so wait_idle must wait for it through the
outage; for the later steps a requeueable job runs there. In every case
(`outage_matrix.problems`):

- the incident resolves, with one repair (a reboot);
- the Crusoe emulator's own record shows exactly one cloud operation for it (besides one
  the Crusoe API's own outage cut short), and none that started while the job still ran
  on the node;
- a requeueable job was requeued exactly once (restart count 1, our AdminComment marker);
  the held job ran to its end, and the requeue step saw it;
- the node's final Slurm state matches the incident (resolved: not drained), and it is not
  left cordoned in Kubernetes.

Each case prints where the outage really landed, what the incident's timeline says about
it, and its duration; the module prints each case's duration and the total. Prometheus's
and Alertmanager's cases run side by side (their outages reach no incident); the rest one
at a time, the nodes in turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from autoclusters.sandbox.drivers.outage_matrix import (
    OutageCase,
    describe,
    matrix,
    problems,
    run_matrix_case,
    waves,
)
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.matrix_sandbox import matrix_group

pytestmark = pytest.mark.integration  # the matrices' real sandboxes

# Long enough to outlast a step's first three retries (at 1, 3 and 7 s: 1 s, 2 s, 4 s
# apart) and a heartbeat timeout (10 s): the runbook must ride the outage out, not be lucky.
# Not 15: the fourth retry comes at 15 s (8 s later), and an outage of exactly that length
# made each case a coin toss between a retry just in time and one 16 s later.
OUTAGE_S = 12
# The matrices' sandboxes side by side (tests/matrix_sandbox.py: xdist groups, one worker
# each, shared with the chaos matrix), the waves dealt out in turn.
WAVES = [
    pytest.param(w, id="+".join(c.id for c in w), marks=matrix_group(i))
    for i, w in enumerate(waves(matrix()))
]
_durations: list[tuple[str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def _print_durations() -> Iterator[None]:
    started = time.monotonic()
    yield
    total = time.monotonic() - started
    lines = "\n".join(f"  {case:<45} {s:6.1f}s" for case, s in _durations)
    print(f"\noutage matrix: {total:.0f}s for {len(_durations)} runs\n{lines}")


class NodeTurns:
    """The nodes in turn: a node rests while the others serve the next cases."""

    def __init__(self) -> None:
        self.served = 0

    def take(self, names: list[str], k: int) -> list[str]:
        out = [names[(self.served + i) % len(names)] for i in range(k)]
        self.served += k
        return out


@pytest.fixture(scope="module")
def node_turns() -> NodeTurns:
    return NodeTurns()


# A case is an incident with a 12 s outage in it and the retries that ride it out: about a
# minute alone, but past pytest's 300 s once beside the rest of `make test` on a slower
# machine. A bound for a hang, not a speed (bench/outages.py measures those).
@pytest.mark.timeout(450)
@pytest.mark.parametrize("wave", WAVES)
async def test_outage_at_step(
    matrix_sandbox: SandboxConfig, node_turns: NodeTurns, wave: tuple[OutageCase, ...]
) -> None:
    cfg = matrix_sandbox
    nodes = node_turns.take(cfg.node_names(), len(wave))
    started = time.monotonic()
    # Every case of the wave runs to its end (its job cancelled) before anything fails.
    results = await asyncio.gather(
        *(
            run_matrix_case(cfg, case, node, OUTAGE_S)
            for case, node in zip(wave, nodes, strict=True)
        ),
        return_exceptions=True,
    )
    _durations.append(("+".join(c.id for c in wave), time.monotonic() - started))
    failed = []
    for case, result in zip(wave, results, strict=True):
        if isinstance(result, BaseException):
            failed.append(f"{case.id}: {type(result).__name__}: {result}")
            continue
        print(describe(case, result))
        failed += [f"{case.id}: {p}" for p in problems(case, result)]
    assert not failed, "\n".join(failed)
