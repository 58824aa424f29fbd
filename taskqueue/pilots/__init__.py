"""Pilots as the service sees them: their records, their match (the matcher's entry point),
their reports and logs, the sites' status, the dashboard's activity and the agents'
monitoring reads."""
