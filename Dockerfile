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
ENTRYPOINT ["autoclusters"]
CMD ["worker"]
