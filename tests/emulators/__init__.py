"""The tests of the sandbox's stand-ins: Kubernetes (and kubectl), Crusoe, Slinky, inference."""
