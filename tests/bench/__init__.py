"""The benchmarks' own tests (bench/)."""
