"""The cluster providers behind the `cluster_*` activities: one interface (base.py), one
implementation per provider (managed_slurm.py: sandbox and crusoe-managed-slurm; cmk.py:
crusoe-cmk), chosen once per call by the cluster's provider (registry.py), and the Slurm-side
bring-up both share (slurm_bring_up.py).

Nothing is imported here: loading the interface must not load the CMK provider's
`kubernetes` client on a worker that serves no CMK cluster.
"""
