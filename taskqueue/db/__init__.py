"""The database: the schema (models), engines and sessions, client-side statement
deadlines, bulk writes, the job counts the database keeps itself, the health check and
group commit."""
