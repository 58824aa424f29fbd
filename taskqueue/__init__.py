"""The task-queue core: models, the job state machine, settings, errors and queue operations.

This package depends on the standard library and SQLAlchemy only; the layers above it
(optimizers, matcher, agents, the CLI) call in, never the other way round.
"""
