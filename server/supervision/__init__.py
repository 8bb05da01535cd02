"""Policy once a server runs: the `Supervisor` (`supervisor.py`) and the parts it holds: bringing
up a generation (`starting.py`), the log's effects (`log_events.py`), recovery after ready with its
monitor thread (`recovery.py`, `monitor.py`, the restart budget in `restart_policy.py`), cancels
(`cancel_watch.py`, weighed by `cancel_policy.py`), the keep-alive (`keep_alive.py`), the visible
status (`status.py`), replica and multi-machine roles (`replica_watch.py`, `multi_host.py`,
`wedge_watch.py`, `replica_network.py`) and servers left behind (`adoption.py`). Imports process/
and the packages below it; only registry.py imports it.
"""
