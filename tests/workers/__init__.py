"""The worker's tests, the replay of recorded histories included (workers/)."""
