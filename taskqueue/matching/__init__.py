"""Which job a pilot gets: the claim (SQL and the database functions' callers), the site
mask and limits, explain (the rules restated for people) and reach (for every
configured queue at once)."""
