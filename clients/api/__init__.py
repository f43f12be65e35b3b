"""The HTTP API: Alertmanager webhooks and node-agent reports open or join incidents;
operators list and read incidents. `create_app` in `clients.api.app` builds it from the
routers in `clients.api.routes`.
"""
