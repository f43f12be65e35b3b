"""The node agent's tests (clients/agent/)."""
