"""One server process on this machine: its program, port, key and environment made ready
(`launch_prep.py`), spawned in its own process group under a watchdog (`process_group.py`,
`watchdog.py`), one generation's run (`server_run.py`: log files, readiness, state file), the
GPU lock across processes (`gpu_lock.py`), the port's owner, the health probe, the cancel-aware
lock waits and every deadline (`timeouts.py`). Imports only launch/ and the packages below it.
"""
