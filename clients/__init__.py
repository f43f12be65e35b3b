"""What starts and steers workflows: the CLI, the HTTP API (with the web console) and the
per-node health agent."""
