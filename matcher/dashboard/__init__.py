"""The operators' dashboard: server-rendered pages under /ui/ (overview, sites, task queues,
jobs, pilots), a sign-in that exchanges a token for a session cookie, and operator actions
behind a confirmation. Templates and static files ship inside this package: no build step and
nothing fetched from the internet."""

from matcher.dashboard import account, jobs, overview, pilots, sites, taskqueues
from matcher.dashboard.web import bp

__all__ = ["account", "bp", "jobs", "overview", "pilots", "sites", "taskqueues"]
