"""``python -m gridpilot`` runs the command line."""

from gridpilot.cli import main

main()
