"""Running a planned build from this process: the launcher (lock, recover, run, publish), ``write_dataset`` (a
table in memory), the command line's options and the report a build shows."""
