"""The tests of the sandbox's own parts: its commands, processes, ports, restarts."""
