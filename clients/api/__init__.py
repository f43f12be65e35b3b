"""The HTTP API: Alertmanager webhooks and node-agent reports open or join incidents;
operators list and read incidents. `create_app` in `clients.api.app` builds it.

Kept free of imports so `clients.incidents` can use the inventory without loading FastAPI.
"""
