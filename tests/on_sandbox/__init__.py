"""End-to-end tests on a real sandbox: the demo and its scenarios, chaos, outages."""
