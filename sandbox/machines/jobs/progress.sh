#!/bin/bash
# Stand-in for a training job (the real torchrun job arrives later): one task on each of
# two nodes, each logging a progress line a second. SLURM_RESTART_COUNT tells a requeued
# run from the first.
#SBATCH --job-name=progress
#SBATCH --nodes=2
#SBATCH --requeue
#SBATCH --open-mode=append
srun --kill-on-bad-exit=1 --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c '
  i=0
  while true; do
    echo "ts=$(date +%s.%N) node=$SLURMD_NODENAME restart=${SLURM_RESTART_COUNT:-0} step=$i"
    i=$((i + 1))
    sleep 1
  done'
