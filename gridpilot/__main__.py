"""``python -m gridpilot`` runs the command line."""

from gridpilot.entry import main

main()
