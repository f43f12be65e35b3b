"""The Crusoe Cloud the sandbox stands in for: its API v1, and the provider's ticket desk.

- emulator: the API process (its app, its backends)
- world: what it knows: VMs, node pools, clusters, async operations
- controls: the front door (signed requests) and the test controls
- signature: its own check of a request's signature
- slurm_api, slurm_models: Managed Slurm clusters, and the bodies they accept
- cmk_api, cmk_models: CMK (Kubernetes) clusters, and the bodies they accept
- route_table: routes analysed once per process
- cloud_api: the emulator as the sandbox's cloud, in every mode (how it is started)
- ticket_desk: the provider's ticket desk that receives AutoClusters' hand-offs
"""
