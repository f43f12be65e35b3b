"""The HTTP API's tests (clients/api/, clients/web/, clients/server.py)."""
