"""What starts and steers workflows: the CLI (and later the HTTP API and the node agent)."""
