"""The two watches a head + headless deployment needs that upstream does not do (docs/replicas.md, sections 3, 7).

* `StallPolicy` (the head): when a remote replica dies, vLLM-Omni 0.30's head wedges. Its
  orchestrator blocks for good in `MembershipController._detach_replica` (a blocking ZMQ send
  to the lost replica), so jobs stay `queued` / `in_progress` while `/health` stays 200 and
  nothing is logged. The launcher therefore treats "jobs wait and nothing moves for
  `head_stall_timeout_s`" as a dead head and restarts it. Something moves when a job that was
  waiting changes status or goes away, or when the head's own replica prints denoise steps
  (the only progress the head's log shows; a remote replica's steps print on its own box).
  So the timeout must be longer than the longest job a remote replica runs alone.
* `HeadLossPolicy` (a joined replica): a headless runtime registered with a head that has exited
  keeps the old head's sockets and would never get a job again, and upstream does not notice.
  The head's registration port refusing connections means the head is gone: restart at once
  (the new runtime registers when the head is back). A port that does not answer at all (the
  network) counts after `unreachable_s`.

Both are pure bookkeeping with the clock passed in, so the policies are unit-tested without
servers; `server/supervision/multi_host.py` feeds them from the job list and a TCP probe.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

WAITING = ("queued", "in_progress")      # /v1/videos job states of a job that is not over


@dataclass
class StallPolicy:
    """Whether a head has made no progress for `timeout_s` while jobs wait."""

    timeout_s: float
    _waiting: dict[str, str] = field(default_factory=dict, init=False)
    _activity: float = field(default=0.0, init=False)
    _since: Optional[float] = field(default=None, init=False)

    def observe(self, now: float, jobs: Mapping[str, str], activity: float) -> Optional[float]:
        """Feed one look at the head: `jobs` id -> status (the job list), `activity` the time the
        head's log last showed denoise progress. Returns the seconds without progress once they
        reach the timeout (the head is wedged), else None. A job that arrives is not progress."""
        waiting = {job: status for job, status in jobs.items() if status in WAITING}
        moved = any(jobs.get(job) != status for job, status in self._waiting.items()) or activity > self._activity
        self._waiting, self._activity = waiting, max(activity, self._activity)
        if not waiting:
            self._since = None
            return None
        if moved or self._since is None:
            self._since = now
            return None
        stalled = now - self._since
        return stalled if stalled >= self.timeout_s else None

    @property
    def waiting(self) -> int:
        """Jobs waiting at the last look."""
        return len(self._waiting)


REFUSED, UNREACHABLE, REACHABLE = "refused", "unreachable", "reachable"


@dataclass
class HeadLossPolicy:
    """Whether the head a replica registered with is gone."""

    unreachable_s: float
    _since: Optional[float] = field(default=None, init=False)

    def observe(self, now: float, probe: str) -> Optional[str]:
        """Feed one TCP probe of the head's registration port (REFUSED, UNREACHABLE or REACHABLE);
        returns REFUSED or UNREACHABLE when the head counts as gone, else None."""
        if probe == REACHABLE:
            self._since = None
            return None
        if probe == REFUSED:
            return REFUSED
        self._since = now if self._since is None else self._since
        return UNREACHABLE if now - self._since >= self.unreachable_s else None
