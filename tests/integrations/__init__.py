"""The tests of the clients of the systems we act on (integrations/)."""
