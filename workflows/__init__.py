"""Deterministic workflow code only: no I/O, no clocks, no randomness outside Temporal's APIs."""
