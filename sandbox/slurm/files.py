"""slurm.conf, gres.conf (and slurmdbd.conf) for a sandbox: slurmd processes on localhost,
"GPUs" that are plain files.

`slurm_conf(cfg)` / `gres_conf(cfg)` are the static layout (`cfg.node_names()`, one `gpu`
partition); `render_slurm_conf` / `render_gres_conf` render any node layout, which the
Crusoe emulator's Managed Slurm writes from a cluster's configuration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig


@dataclass(frozen=True)
class NodeDef:
    name: str
    port: int  # the node's slurmd port (stable: a node keeps its port across layouts)
    gpus: int = GPUS_PER_NODE
    drained: str | None = None  # declared `State=DRAIN Reason=...`: it registers drained


@dataclass(frozen=True)
class Layout:
    nodes: list[NodeDef]
    partitions: dict[str, list[str]]  # partition -> its nodes; the first is the default
    accounting: bool = False  # slurmdbd on localhost at `cfg.slurmdbd_port`
    topology: bool = False  # TopologyPlugin=topology/tree (topology.conf beside slurm.conf)
    header: str = "Written by `autoclusters sandbox up`"
    extra: list[str] = field(default_factory=list)


def static_layout(cfg: SandboxConfig) -> Layout:
    nodes = [NodeDef(name, cfg.slurmd_port(i)) for i, name in enumerate(cfg.node_names())]
    return Layout(nodes=nodes, partitions={"gpu": ["ALL"]})


def slurm_conf(cfg: SandboxConfig) -> str:
    return render_slurm_conf(cfg, static_layout(cfg))


def _node_line(n: NodeDef) -> str:
    gres = f" Gres=gpu:{n.gpus}" if n.gpus else ""
    state = f'State=DRAIN Reason="{n.drained}"' if n.drained else "State=UNKNOWN"
    return (
        f"NodeName={n.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={n.port} "
        f"CPUs=4 RealMemory=4000{gres} {state}"
    )


def _accounting(cfg: SandboxConfig, on: bool) -> str:
    if not on:
        return (
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none"
        )
    # AccountingStoragePass: the munge socket for slurmdbd traffic (AuthInfo is not used for
    # it; without this, sacct and slurmctld try the system socket and fail).
    return f"""\
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={cfg.slurmdbd_port}
AccountingStoragePass={cfg.munge_socket}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"""


def render_slurm_conf(cfg: SandboxConfig, layout: Layout) -> str:
    d = cfg.state_dir
    nodes = "\n".join(map(_node_line, layout.nodes))
    partitions = "\n".join(
        f"PartitionName={p} Nodes={','.join(members)}{' Default=YES' if i == 0 else ''} "
        "MaxTime=INFINITE State=UP"
        for i, (p, members) in enumerate(layout.partitions.items())
        if members
    )
    topology = "TopologyPlugin=topology/tree\n" if layout.topology else ""
    return f"""\
# {layout.header}; every path and port belongs to this sandbox.
ClusterName={cfg.cluster}
SlurmctldHost=localhost
SlurmctldPort={cfg.slurmctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={cfg.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/slurm/ctld
SlurmdSpoolDir={cfg.spool_dir}/%n
SlurmctldPidFile={d}/slurm/slurmctld.pid
SlurmdPidFile={d}/slurm/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
{_accounting(cfg, layout.accounting)}
{topology}GresTypes=gpu
# Nodes are declared with more CPUs than this machine has; trust the config.
SlurmdParameters=config_overrides
# A re-registered (replaced) node comes back by itself unless we drained it.
ReturnToService=2
JobRequeue=1
SlurmdTimeout=15
SlurmctldTimeout=15
KillWait=2
MinJobAge=3600
InactiveLimit=0
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
{nodes}
{partitions}
"""


def gres_conf(cfg: SandboxConfig) -> str:
    # The "GPUs" are plain files: Slurm only needs something to point File= at.
    dev = cfg.state_dir / "dev"
    last = GPUS_PER_NODE - 1
    return f"NodeName=gpu-[01-{len(cfg.node_names()):02d}] Name=gpu File={dev}/nvidia[0-{last}]\n"


def render_gres_conf(cfg: SandboxConfig, nodes: list[NodeDef]) -> str:
    """One line per node with GPUs (their device files under <state>/dev must exist)."""
    dev = cfg.state_dir / "dev"
    return "".join(
        f"NodeName={n.name} Name=gpu File={dev}/nvidia[0-{n.gpus - 1}]\n" if n.gpus > 1
        else f"NodeName={n.name} Name=gpu File={dev}/nvidia0\n"
        for n in nodes
        if n.gpus
    )  # fmt: skip


def listed_nodes(cfg: SandboxConfig) -> set[str]:
    """The nodes the sandbox's slurm.conf declares now (none when there is no slurm.conf)."""
    try:
        text = cfg.slurm_conf.read_text()
    except FileNotFoundError:
        return set()
    return set(re.findall(r"^NodeName=(\S+)", text, flags=re.MULTILINE))
