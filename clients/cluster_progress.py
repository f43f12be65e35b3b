"""What `autoclusters cluster create` (and `status`) show of a provisioning: per node set
the machines requested / booted / registered / healthy, and what the workflow waits on.

Two forms: a Rich live table redrawn in place on a terminal, and plain lines (one per
change) when stdout is a pipe or a file, so logs and CI output stay readable.
"""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autoclusters.core.cluster import ClusterState
from autoclusters.core.cluster_ops import OpsState

# The provisioning's steps (workflows/cluster_provisioning.py), as what is being waited on.
_WAITING_ON = {
    "create_controller": "the provider to create the Slurm controller",
    "create_accounting": "the provider to create the accounting database (slurmdbd)",
    "create_shared_home": "the provider to create the shared /home",
    "create_login_nodes": "the provider to create the login nodes",
    "boot_machines": "the machines to boot",
    "register_and_gate": "the nodes to register with slurmctld and pass their health gate",
    "acceptance": "the acceptance job of every node set",
    "add_users": "the users and their Slurm accounts",
    "attach_policy": "the remediation policy to attach (fleet guard)",
    "cleanup": "what was created to be deleted",
}


def waiting_on(state: ClusterState) -> str:
    if state.status == "ready":
        return "nothing: the cluster is ready"
    step = state.current_step
    if step is None:
        return "the workflow to start" if state.status == "provisioning" else "-"
    what = _WAITING_ON.get(step, step)
    if state.status == "failed" and step != "cleanup":
        return f"nothing: failed in {step}"
    return f"{what} ({step})"


def progress_table(state: ClusterState) -> Table:
    t = Table("node set", "requested", "booted", "registered", "healthy", "replaced")
    for name, p in state.progress.items():
        t.add_row(
            Text(name), str(p.requested), str(p.booted), str(p.registered), str(p.healthy),
            str(p.replaced) if p.replaced else "",
        )  # fmt: skip
    return t


def render(state: ClusterState | None, cluster: str) -> RenderableType:
    if state is None:
        return Text(f"{cluster}: waiting for a worker to answer the status query", style="yellow")
    head = Text.assemble(
        (state.cluster, "bold"),
        f" ({state.provider}): ",
        (state.status, {"ready": "green", "failed": "red"}.get(state.status, "cyan")),
        f"; waiting on {waiting_on(state)}",
    )
    parts: list[RenderableType] = [head, progress_table(state)]
    if state.failure:
        parts.append(Text(f"failure: {state.failure}", style="red"))
    return Group(*parts)


def plain_line(state: ClusterState | None, cluster: str) -> str:
    if state is None:
        return f"{cluster}: waiting for a worker to answer the status query"
    line = f"{state.cluster}: {state.status}, waiting on {waiting_on(state)}"
    if state.progress:
        line += f"; {state.progress_line()}"
    return line


class PlainProgress:
    """One line per change of status, step or counts (nothing when it is the same)."""

    def __init__(self, console: Console, cluster: str) -> None:
        self._console, self._cluster = console, cluster
        self._last: str | None = None

    def show(self, state: ClusterState | None) -> None:
        line = plain_line(state, self._cluster)
        if line != self._last:
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._last = line

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_: object) -> None:
        pass


class LiveProgress:
    """The table redrawn in place; what it showed last stays on the screen."""

    def __init__(self, console: Console, cluster: str) -> None:
        self._cluster = cluster
        self._live = Live(render(None, cluster), console=console, refresh_per_second=4)

    def show(self, state: ClusterState | None) -> None:
        self._live.update(render(state, self._cluster), refresh=True)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()


def progress_for(console: Console, cluster: str) -> PlainProgress | LiveProgress:
    """Live on a terminal, plain lines otherwise."""
    if console.is_terminal:
        return LiveProgress(console, cluster)
    return PlainProgress(console, cluster)


def ops_line(state: OpsState | None, what: str) -> str:
    if state is None:
        return f"{what}: waiting for a worker to answer the status query"
    line = f"{what}: {state.status}"
    if state.current_step and state.status == "running":
        line += f", step {state.current_step}"
    done = [
        f"{label} {', '.join(nodes)}"
        for label, nodes in (("added", state.added), ("removed", state.removed))
        if nodes
    ]
    if state.deleted:
        done.append(f"deleted {len(state.deleted)} resources")
    if done:
        line += "; " + "; ".join(done)
    if state.failure:
        line += f"; failure: {state.failure}"
    return line
