"""Clients of the systems we act on: Slurm, Kubernetes, Crusoe, Slack, Temporal."""
