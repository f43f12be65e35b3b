"""The web console's tests (clients/console/), in process and in headless Chromium."""
