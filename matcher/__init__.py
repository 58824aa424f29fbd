"""The matcher HTTP service (issue 4)."""
