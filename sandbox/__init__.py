"""The embedded default: a whole local cluster (Temporal, munge, Slurm, a worker) on loopback."""
