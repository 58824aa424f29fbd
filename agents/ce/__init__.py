"""Compute elements: where the site director sends pilots (agents.ce.base is the interface,
agents.ce.registry builds a queue's CE from the resources configuration)."""
