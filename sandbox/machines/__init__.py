"""The sandbox's machines: the Crusoe emulator's VMs as slurmd processes, their faults, their jobs.

- backend: powering machines on and off; the Crusoe emulator's VM backend
- vms: which VM stands behind each node, and the repairs done on it
- names: which Slurm node each machine is
- racks: which rack and NVLink clique each machine is in (its Node's labels)
- hardware: simulated hardware faults
- fault_effects: what a hardware fault does to the job
- job_faults: silent faults (a rank that hangs or slows down)
- agent_targets: the node agents Prometheus scrapes
- training_job: the job the demo runs (`jobs/progress.sh` without PyTorch)
- joblog: reading a training job's own progress log
"""
