"""Job description parsing, the resources configuration and the optimizer chain."""
