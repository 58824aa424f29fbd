"""The matcher: the central HTTP service users submit to and pilots pull from.

``create_app(settings)`` builds it; ``gridpilot serve`` runs it under gunicorn. Any number of
processes may serve one database: no state that must agree lives in process memory.
"""

from matcher.app import create_app

__all__ = ["create_app"]
