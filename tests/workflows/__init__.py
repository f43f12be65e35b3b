"""The workflows' tests, on the time-skipping test server (workflows/)."""
