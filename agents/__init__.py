"""The central long-running loops: site director, SubmitPool maintenance, stalled jobs."""
