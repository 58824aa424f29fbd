"""Jobs and their task queues: insertion, changes of status, fair share, SubmitPools, kill
and reschedule, silent jobs, jobs no configured queue can run, the purge."""
