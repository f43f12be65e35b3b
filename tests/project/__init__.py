"""The repository's own checks: docs, lanes, packaging, imports, deployment files."""
