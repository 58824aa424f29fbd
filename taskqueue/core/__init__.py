"""The pure parts of the task queue, no database library: job states, the one exception
hierarchy, the settings of every component, CPU-time/processor/memory buckets, task-queue
definitions and a pilot's resource description."""
