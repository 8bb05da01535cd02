"""How soon a Cancel must take effect: the one bound every cancel test asserts, so no test picks its own.

The launcher promises that a cancel ends a blocked read within 1 s (the client waits in 0.1 s
slices, checking should_cancel and its deadlines) and that a cancelled start's process group is
gone within 2 s (SIGTERM, then SIGKILL after the package's CANCEL_STOP_S). The tests allow the
promise plus slack for a busy 2-core CI box, and no more: a test that waited longer would pass a
cancel that the user sees hang."""
from __future__ import annotations

from vllm_omni_launcher.server.process.timeouts import CANCEL_STOP_S

CANCEL_LATENCY_S = 1.5                              # a cancel (or a read deadline) takes effect within 1 s, + slack
LAUNCH_CANCEL_S = CANCEL_STOP_S + CANCEL_LATENCY_S  # a cancelled launch: its whole process group is gone
