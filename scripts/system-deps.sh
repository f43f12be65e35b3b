#!/usr/bin/env bash
# Slurm, munge, and what a Managed Slurm cluster runs in the sandbox (slurmdbd on a private
# MariaDB, an sshd login endpoint) and its alert path (Prometheus, Alertmanager) come from
# the distribution, not from PyPI. Install them when missing (as root), or say exactly what
# to install. None runs as a system service:
# the sandbox starts its own under its state dir.
set -euo pipefail
missing=()
for exe in slurmctld slurmd munged munge sinfo squeue scontrol sbatch scancel sacct sacctmgr \
  slurmdbd mariadbd mariadb-install-db mariadb-admin mariadb sshd ssh ssh-keygen prometheus; do
  command -v "$exe" >/dev/null 2>&1 || [ -x "/usr/sbin/$exe" ] || missing+=("$exe")
done
# Debian names Alertmanager's binary prometheus-alertmanager; upstream's is alertmanager.
command -v prometheus-alertmanager >/dev/null 2>&1 || command -v alertmanager >/dev/null 2>&1 \
  || missing+=(prometheus-alertmanager)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromedriver)  # tests/console/test_console_browser.py
# tests/emulators/test_kubectl.py: a real kubectl against the Kubernetes emulator's HTTPS port, whose
# certificate openssl makes at start-up.
command -v kubectl >/dev/null 2>&1 || missing+=(kubectl)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# Sandbox fault effects (sandbox/machines/fault_effects.py): a hung or lost node's connections go
# silent through nftables rules in a table of the sandbox's own.
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nft)
# Optional: what lets scripts/python.sh build the venv from the distribution's optimised
# CPython (Debian's python3-venv); without it the venv is made from the python3 on PATH.
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 && [ -x /usr/bin/python3 ] \
  && /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  && ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
  echo "installing python3-venv (scripts/python.sh)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; } \
    || echo "python3-venv not installed: the venv is made from python3 on PATH" >&2
fi
[ ${#missing[@]} -eq 0 ] && exit 0

pkgs="slurm-wlm slurmrestd munge slurm-wlm-jwt-plugin slurmdbd mariadb-server openssh-server"
pkgs+=" chromium chromium-driver"  # headless Chromium + driver for the console browser test
pkgs+=" prometheus prometheus-alertmanager"
pkgs+=" openssl"
pkgs+=" nftables"
# Debian's kubectl, only when there is none (one installed another way is kept).
command -v kubectl >/dev/null 2>&1 || pkgs+=" kubernetes-client"
if [ "$(id -u)" -ne 0 ]; then
  echo "missing: ${missing[*]}" >&2
  echo "install them as root:  apt-get update && apt-get install -y $pkgs" >&2
  exit 1
fi
echo "installing $pkgs (missing: ${missing[*]})"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $pkgs >/dev/null
