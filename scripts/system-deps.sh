#!/usr/bin/env bash
# Slurm and munge come from the distribution, not from PyPI. Install them when missing
# (as root), or say exactly what to install.
set -euo pipefail
missing=()
for exe in slurmctld slurmd munged munge sinfo squeue scontrol sbatch scancel; do
  command -v "$exe" >/dev/null 2>&1 || [ -x "/usr/sbin/$exe" ] || missing+=("$exe")
done
[ ${#missing[@]} -eq 0 ] && exit 0

pkgs="slurm-wlm slurmrestd munge slurm-wlm-jwt-plugin"
if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${missing[*]}" >&2
  echo "install them as root:  apt-get update && apt-get install -y $pkgs" >&2
  exit 1
fi
echo "installing $pkgs (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $pkgs >/dev/null
