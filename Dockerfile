# The AutoClusters worker image. Slurm client commands and munge come from the
# distribution: the worker drives Slurm through sinfo/squeue/scontrol with --json.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client munge \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
# autoclusters/ links the layer folders into the one import root. The sandbox is left out
# (its link dangles, so it is not packaged), and no extra is installed: no Temporal CLI
# binary, no torch.
COPY autoclusters ./autoclusters
COPY core ./core
COPY integrations ./integrations
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY clients ./clients
RUN pip install --no-cache-dir .
# The same image runs every part (docker-compose.yml, deploy/kubernetes/): `worker` (metrics
# on AUTOCLUSTERS_WORKER__METRICS_PORT, 9464 there), `api run` (8480) and, on each GPU node,
# `agent run` (dcgm-exporter's series on 9400; NVML comes from the host's driver through the
# NVIDIA container runtime).
EXPOSE 8480 9464 9400
ENTRYPOINT ["autoclusters"]
CMD ["worker"]
