"""The tests of the shared models, the policy, settings and pure arithmetic (core/)."""
