"""The front door: the ``gridpilot`` command line and the demo. Nothing imports this package."""
