"""Slurm as real local daemons: the Managed Slurm cluster the Crusoe emulator creates.

- controller: one sandbox's Managed Slurm cluster (slurmctld, slurmdbd, login), as daemons
- files: slurm.conf, gres.conf and slurmdbd.conf for the sandbox
- topology: a topology.conf that places nodes no switch lists (a scaled-out node)
"""
