"""What the HTTP API and the web console share, below both so that neither imports the
other: the server's settings (`settings.ApiSettings`, AUTOCLUSTERS_API_* and the console's)
and the bearer-token check for writes and logins (`auth.BearerAuth`).

`clients/server.py` assembles the two into the one app that `autoclusters api run` serves.
"""
