"""The activities' and cluster providers' tests (activities/)."""
