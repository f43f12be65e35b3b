"""The `autoclusters` CLI's tests (clients/cli/)."""
