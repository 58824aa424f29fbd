"""The site simulator behind ``gridpilot simulate``: what multi-core pilots, time-aware asks and
``$JOBSTATUS``-guided draining save, measured by running the pilot's own decision code against
simulated time."""
