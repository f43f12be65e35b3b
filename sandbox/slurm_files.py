"""slurm.conf and gres.conf for a sandbox: N slurmd on localhost, 8 "GPUs" each."""

from __future__ import annotations

from autoclusters.sandbox.config import GPUS_PER_NODE, SandboxConfig


def slurm_conf(cfg: SandboxConfig) -> str:
    d = cfg.state_dir
    nodes = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={cfg.slurmd_port(i)} "
        f"CPUs=4 RealMemory=4000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        for i, name in enumerate(cfg.node_names())
    )
    return f"""\
# Written by `autoclusters sandbox up`; every path and port belongs to this sandbox.
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
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
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
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def gres_conf(cfg: SandboxConfig) -> str:
    # The "GPUs" are plain files: Slurm only needs something to point File= at.
    dev = cfg.state_dir / "dev"
    last = GPUS_PER_NODE - 1
    return f"NodeName=gpu-[01-{len(cfg.node_names()):02d}] Name=gpu File={dev}/nvidia[0-{last}]\n"
