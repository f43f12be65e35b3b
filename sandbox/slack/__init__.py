"""The Slack the sandbox stands in for.

- emulator: the Web API and interactivity source
- workspace: channels, messages, threads, user groups, faults
- cli: `autoclusters sandbox slack`: click its buttons, read its channel
"""
