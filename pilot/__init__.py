"""The worker-node program: standard library and ``requests`` only."""
