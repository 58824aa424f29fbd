"""The job submitter's side of gridpilot: ``gridpilot-client`` (submit, follow, kill jobs over
the matcher's HTTP API) and the PSI/J executor that submits into gridpilot.

It needs only the standard library, ``requests`` and ``click`` (and ``psij`` for the
executor), never a database library: users install it anywhere (``pip install
'gridpilot[pilot]'``).
"""
