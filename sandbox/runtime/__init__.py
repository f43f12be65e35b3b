"""The plumbing every part of the sandbox uses.

- config: where a sandbox lives and which ports it uses
- daemons: how each daemon is started, and how we know it is ready
- processes: daemons recorded by PID, stopped by exactly that PID
- port_holders: who holds a TCP port, when a daemon cannot bind it
- api_tokens: the sandbox's API credentials, one per role
- wakeups: a loop that waits for "something changed"
"""
