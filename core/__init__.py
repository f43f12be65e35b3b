"""What every layer shares: models, the policy, settings; no I/O."""
