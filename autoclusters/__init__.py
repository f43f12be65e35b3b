"""AutoClusters: durable, workflow-orchestrated runbooks for GPU cluster health."""
