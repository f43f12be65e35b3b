# The AutoClusters worker image. Slurm client commands and munge come from the
# distribution: the worker drives Slurm through sinfo/squeue/scontrol with --json.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-client munge \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY autoclusters ./autoclusters
COPY workflows ./workflows
COPY activities ./activities
COPY workers ./workers
COPY clients ./clients
COPY sandbox ./sandbox
RUN pip install --no-cache-dir .
ENTRYPOINT ["autoclusters"]
CMD ["worker"]
