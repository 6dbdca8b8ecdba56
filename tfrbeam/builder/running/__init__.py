"""Running a planned build: the launcher (lock, recover, run, publish), the runner and its workers, progress
across processes, and the report a build shows."""
