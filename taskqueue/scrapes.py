"""Who may read the metrics without an operator's token: a scraper that brings the long-lived
metrics token, or one from an allowed address ([matcher] metrics_token, metrics_allow). The
matcher's /metrics and the agents' metrics endpoint admit the same scrapers."""

from __future__ import annotations

import hmac
import ipaddress

from taskqueue.core.settings import MatcherSettings


def scraper_admitted(settings: MatcherSettings, authorization: str, peer: str | None) -> bool:
    """Whether a scrape with this Authorization header from the client address ``peer`` may
    read the metrics."""
    token = settings.metrics_token
    if token and authorization.startswith("Bearer ") and hmac.compare_digest(
            authorization.removeprefix("Bearer ").strip().encode(), token.encode()):
        return True
    if settings.metrics_allow and peer:
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in ipaddress.ip_network(net, strict=False)
                   for net in settings.metrics_allow)
    return False
