"""The files of jobs: sandbox records and their store (a local folder or S3), and the
replica catalogue."""
