"""In-memory fakes the tests share: Slurm, the cloud and the notifiers (systems), a cluster
provider (provider, ops), GPU sharing (share, borrow), a console fleet (fleet)."""
