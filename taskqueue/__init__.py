"""The task-queue core: everything the services do to jobs, task queues and pilots in the
database, in six wings (core, db, queues, files, matching, pilots; each says its purpose in its
``__init__.py``, and imports only the wings below it).

This package depends on the standard library and SQLAlchemy only; the layers above it
(optimizers, matcher, agents, the CLI) call in, never the other way round.
"""
