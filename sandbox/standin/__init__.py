"""A stand-in cluster in memory, for the scale benchmark (thousands of nodes).

- cluster: the Slurm cluster and its cloud, in memory
- server: that cluster over HTTP, with its nodes' agents
- clients: the worker's side: a `SlurmClient` and a `CloudProvider` over HTTP
"""
