"""The embedded default: a whole local cluster (Temporal, munge, Slurm, a worker) on loopback.

What it stands in for, one package each (each `__init__` maps its modules): `kubernetes`
(the API server), `crusoe` (the cloud API and the provider's ticket desk), `slurm` (Slurm as
real daemons), `slinky` (Slurm on Kubernetes, the CMK platform), `machines` (the VMs as
slurmd processes, their faults and jobs), `inference`, `slack`, `standin` (the scale
benchmark's cluster in memory). What drives it: `drivers` (the demo and its scenarios, chaos,
outages, matrices). Beneath them all, `runtime` (config, daemons, processes, ports).

Here: `cli` (the commands), `cluster` (`sandbox up | status | down`), `provision`,
`previous_runs`, `monitoring`, `restart`, `boot_slots`.
"""
