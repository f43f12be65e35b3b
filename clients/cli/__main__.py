"""`python -m autoclusters.clients.cli ...`: the `autoclusters` command without its script
(how the sandbox starts its worker and agents, and how tests run the real CLI)."""

from autoclusters.clients.cli.app import main

main()
