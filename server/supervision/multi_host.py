"""Several machines behind one endpoint: vLLM-Omni's head and headless replicas, as supervisor roles.

A Supervisor runs one of three roles (docs/replicas.md, section 7):

* `ServerRole` (the default): `vllm serve MODEL --omni`, an HTTP server, ready when `/health`
  and `/v1/models` answer.
* `HeadRole` (`serve --accept-replicas PORT`): the same server, plus upstream's stage-0 head
  flags, so replicas on other machines can register on PORT:
  `--stage-id 0 --omni-master-address HOST --omni-master-port PORT --omni-lb-policy round-robin`.
  HOST is the local config's `replica_registration_host` (loopback unless the operator chose
  otherwise: the port is unauthenticated upstream, so a HOST that is not private is refused
  unless the config allows it: replica_network.py). The head's own replicas come from
  `--omni-dp-size-local` (a `num_replicas` stage override is overwritten on a head). Round-robin,
  because the queue lengths `least-queue-length` reads are heartbeats up to 5 s old, and a
  video job is one long request. Watched for the wedge (wedge_watch.StallPolicy).
* `JoinRole` (`serve --join ADDR:PORT`): a headless runtime, `vllm serve MODEL --omni --headless
  --stage-id 0 --omni-master-address ADDR --omni-master-port PORT [--omni-dp-size-local N
  --stage-overrides '{"0":{"devices":...}}'] [--omni-replica-address A]`. No HTTP port and no
  API key: it is ready once each of its replicas printed upstream's "StageDiffusionProc
  registered with OmniCoordinator" (failure_patterns.REPLICA_REGISTERED, counted from the
  lines its log follower delivers: `Registrations`), and it is restarted when its process dies (the supervisor's
  crash path) or the head is gone (wedge_watch.HeadLossPolicy), so that it registers again. Having
  no port, every text about it (starting, ready, restarted, the CLI's line) names its GPUs and its
  head instead (`starting_text`, `ready_at`, `ready_text`), and its run has no URL.

Model, GPUs, parallel layout, memory and replicas are the launch spec's, as for any server; the
role only adds what its upstream runtime needs. Nothing here comes from a workflow: the roles
exist only on the `serve` command line and the addresses in the local config. Both supported
vLLM-Omni lines have all of it (0.26 read in its source: the same flags and checks, the headless
diffusion path, the registration line, round-robin, and the same blocking detach).
"""
from __future__ import annotations

import dataclasses
import errno
import os
import socket
import time
from typing import TYPE_CHECKING, Callable, Optional

from ...client.hosts import is_loopback_host
from ...errors import LauncherError
from ...errors.failure_patterns import REPLICA_REGISTERED
from ..config.local_config import LocalConfig
from ..launch import replicas
from ..launch.spec import LaunchSpec
from ..logs import failures
from ..logs.failures import ServerFailure
from ..process import gpu_lock, probe
from ..process.launch_prep import Launch
from ..process.server_run import ServerRun
from ..storage import private_files
from . import replica_network
from .wedge_watch import REACHABLE, REFUSED, UNREACHABLE, HeadLossPolicy, StallPolicy

if TYPE_CHECKING:
    from ..logs.logwatch import ProgressTracker

LB_POLICY = "round-robin"
STALL_POLL_S = 5.0                      # how often the head's job list is read
HEAD_PROBE_S = 1.0                      # how often a joined replica probes the head's registration port

Watch = Callable[[], Optional[ServerFailure]]


def _every(seconds: float, look: Callable[[float], Optional[ServerFailure]]) -> Watch:
    """`look(now)` at most once per `seconds` (the monitor calls a watch every 0.2 s)."""
    last = [0.0]

    def check() -> Optional[ServerFailure]:
        now = time.monotonic()
        if now - last[0] < seconds:
            return None
        last[0] = now
        return look(now)
    return check


def parse_head_address(text: str) -> tuple[str, int]:
    """`serve --join ADDR:PORT` -> (ADDR, PORT); [v6]:PORT accepted."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LauncherError(f"--join {text!r} is not ADDR:PORT", "a replica registers with the head's address "
                            "and registration port", "write it as --join 10.0.0.5:29555 (the head's "
                            "replica_registration_host and its --accept-replicas PORT)", setting="--join")
    return host, int(port)


def probe_tcp(host: str, port: int, timeout: float = 2.0) -> str:
    """REACHABLE when something accepts a TCP connection on host:port, REFUSED when the host says
    nothing listens there, UNREACHABLE when nothing answered in time."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return REACHABLE
    except ConnectionRefusedError:
        return REFUSED
    except OSError as exc:
        return REFUSED if exc.errno == errno.ECONNREFUSED else UNREACHABLE


def _role_argv(spec: LaunchSpec, argv: list[str]) -> list[str]:
    """`argv` (a spec's launch) with its replicas asked the head/headless way."""
    plain = spec.with_changes(replicas=1).flags()
    flags = spec.flags()
    start = next(i for i in range(len(argv)) if argv[i:i + len(flags)] == flags)
    return [*argv[:start], *plain, *replicas.runtime_replica_flags(spec.replicas, spec.parallel.world_size),
            *argv[start + len(flags):]]


class ServerRole:
    """A plain `vllm serve MODEL --omni` HTTP server (what Local Server and `serve` run)."""

    name = "server"

    def warnings(self) -> list[str]:
        """What the operator should know before this role starts."""
        return []

    def adapt(self, launch: Launch) -> Launch:
        """The prepared launch as this role runs it."""
        return launch

    def spawn(self, launch: Launch, generation: int, data_dir: str, on_segment: Callable[[str, bool], None],
              cancel: Callable[[], bool]) -> ServerRun:
        return ServerRun.spawn(launch, generation, data_dir, on_segment, cancel)

    @property
    def serves_http(self) -> bool:
        """Whether the run has an HTTP port (a joined replica has none: texts and reports name none)."""
        return True

    def starting_text(self, spec: LaunchSpec, where: str, port: int) -> str:
        """The status text while a run starts on `where` (its GPUs)."""
        return f"Starting {spec.served_name} on {where} (port {port})"

    def ready_text(self, spec: LaunchSpec, run: ServerRun, where: str) -> str:
        copies = f", {spec.replicas} replicas" if spec.replicas > 1 else ""
        return f"Ready: {spec.served_name} at {run.url} ({where}{copies})"

    def ready_at(self, spec: LaunchSpec, where: str, url: Optional[str]) -> str:
        """Where a ready run is, for the texts after ready (restarted, a job's OOM, a cancel)."""
        return f"Ready at {url}"

    @property
    def ready_note(self) -> Optional[str]:
        """What the ready text adds after `ready_text` as its note (status.Status.note); None: nothing."""
        return None

    @property
    def watches_replica_processes(self) -> bool:
        """Whether the server's replica processes are its oldest children (replica_watch.ReplicaWatch)."""
        return True

    def watch(self, run: ServerRun, progress: "ProgressTracker") -> Optional[Watch]:
        """A check the monitor runs on the ready run (every 0.2 s); None: nothing beyond the process."""
        return None


@dataclasses.dataclass(frozen=True)
class HeadRole(ServerRole):
    """The head of a head + headless deployment: an HTTP server that accepts replicas on `port`."""

    host: str
    port: int
    stall_timeout_s: float
    name = "head"

    @classmethod
    def from_config(cls, port: int, config: LocalConfig) -> "HeadRole":
        if not 0 < port < 65536:
            raise LauncherError(f"--accept-replicas {port} is not a TCP port", "ports are 1..65535",
                                "use e.g. --accept-replicas 29555", setting="--accept-replicas")
        replica_network.check_registration_host(config.replica_registration_host,
                                                config.allow_public_replica_registration)
        replica_network.check_no_vllm_port(config.extra_env, os.environ)
        return cls(config.replica_registration_host, port, config.head_stall_timeout_s)

    def warnings(self) -> list[str]:
        if is_loopback_host(self.host):
            return [f"Replicas can register on {self.host}:{self.port} only from this machine; to accept other "
                    "machines set replica_registration_host in the launcher config (read the security note first)"]
        return [f"The replica registration port {self.host}:{self.port} (and the head's per-replica ports on "
                f"{self.host}) has NO authentication: anyone who reaches it can join as a replica and receive every "
                "prompt and image. Keep it on a network only your GPU boxes share."]

    def adapt(self, launch: Launch) -> Launch:
        argv = _role_argv(launch.spec, list(launch.command.argv))
        at = argv.index("--host")
        argv[at:at] = ["--stage-id", "0", "--omni-master-address", self.host, "--omni-master-port", str(self.port),
                       "--omni-lb-policy", LB_POLICY]
        return dataclasses.replace(launch, command=dataclasses.replace(launch.command, argv=argv))

    @property
    def ready_note(self) -> Optional[str]:
        return f"accepting replicas on {self.host}:{self.port}"

    @property
    def watches_replica_processes(self) -> bool:
        return False     # a head's oldest child is upstream's coordinator process, not a replica

    def watch(self, run: ServerRun, progress: "ProgressTracker") -> Optional[Watch]:
        policy = StallPolicy(self.stall_timeout_s)

        def look(now: float) -> Optional[ServerFailure]:
            jobs = probe.video_jobs(run.spec.host, run.port, run.api_key)
            if jobs is None:
                return None            # not answering: the /health hang watch owns that
            stalled = policy.observe(now, jobs, progress.last_seen)
            return None if stalled is None else head_stalled(stalled, policy.waiting, self.stall_timeout_s,
                                                             run.tail(40))
        return _every(STALL_POLL_S, look)


@dataclasses.dataclass(frozen=True)
class JoinRole(ServerRole):
    """A headless runtime that registers its replicas with the head at `host`:`port`."""

    host: str
    port: int
    replica_address: Optional[str]
    unreachable_s: float
    name = "replica"

    @classmethod
    def from_config(cls, head: str, config: LocalConfig) -> "JoinRole":
        host, port = parse_head_address(head)
        return cls(host, port, config.replica_address, config.hang_timeout_s)

    def reachable(self) -> None:
        """Refuse to start when nothing listens at the head's address (a clear error instead of
        upstream's registration timeout minutes later)."""
        state = probe_tcp(self.host, self.port)
        if state != REACHABLE:
            raise LauncherError(f"The head at {self.host}:{self.port} is not reachable ({state})",
                                "a replica registers with a running head; nothing accepted a connection there",
                                f"start the head first (serve MODEL --accept-replicas {self.port} on that machine, "
                                "with replica_registration_host set to an address this box can reach), or fix "
                                "--join", setting="--join")

    def adapt(self, launch: Launch) -> Launch:
        argv = _role_argv(launch.spec, list(launch.command.argv))
        at = argv.index("--host")
        del argv[at:at + 4]                                     # --host H --port P: a headless runtime has none
        argv[at:at] = ["--headless", "--stage-id", "0", "--omni-master-address", self.host,
                       "--omni-master-port", str(self.port)]
        if self.replica_address:
            argv[at + 7:at + 7] = ["--omni-replica-address", self.replica_address]
        return dataclasses.replace(launch, command=dataclasses.replace(launch.command, argv=argv))

    def spawn(self, launch: Launch, generation: int, data_dir: str, on_segment: Callable[[str, bool], None],
              cancel: Callable[[], bool]) -> ServerRun:
        registrations = Registrations(on_segment)
        run = HeadlessRun.spawn(launch, generation, data_dir, registrations.segment, cancel)
        assert isinstance(run, HeadlessRun)
        run.expected, run.head, run.registrations = launch.spec.replicas, (self.host, self.port), registrations
        return run

    @property
    def serves_http(self) -> bool:
        return False

    def starting_text(self, spec: LaunchSpec, where: str, port: int) -> str:
        return f"Starting {_copies(spec)} of {spec.served_name} on {where}, to register with {self._head}"

    def ready_text(self, spec: LaunchSpec, run: ServerRun, where: str) -> str:
        return f"Ready: {_copies(spec)} of {spec.served_name} ({where}) registered with {self._head}"

    def ready_at(self, spec: LaunchSpec, where: str, url: Optional[str]) -> str:
        return f"Ready on {where}, registered with {self._head}"

    def joined_text(self, spec: LaunchSpec) -> str:
        """`serve --join`'s line once the replicas registered (clients go to the head)."""
        return (f"{_copies(spec).capitalize()} of {spec.served_name} on {gpu_lock.describe(spec.gpus)} registered "
                f"with {self._head}; clients use the head's endpoint")

    @property
    def _head(self) -> str:
        return f"the head at {self.host}:{self.port}"

    def watch(self, run: ServerRun, progress: "ProgressTracker") -> Optional[Watch]:
        policy = HeadLossPolicy(self.unreachable_s)

        def look(now: float) -> Optional[ServerFailure]:
            lost = policy.observe(now, probe_tcp(self.host, self.port))
            return None if lost is None else head_lost(self.host, self.port, lost, run.tail(40))
        return _every(HEAD_PROBE_S, look)


class HeadlessRun(ServerRun):
    """A headless runtime: ready when each replica printed its registration line; no HTTP.

    While it starts it also probes the head: a runtime that registered with a head which then
    exited waits for that head's handshake for good, so once the head's port refuses after it
    had answered, the run notes why in its log and ends its process group (the supervisor's
    failed-start path follows). A head not up yet is waited for (upstream's registration retries
    the connection and waits 300 s for the answer)."""

    expected = 1
    head: tuple[str, int] = ("127.0.0.1", 0)
    _probed = 0.0
    _head_seen = False
    registrations: Optional["Registrations"] = None

    @property
    def url(self) -> str:
        """Empty: a headless runtime serves no HTTP (clients use the head's endpoint), so there is no URL
        to name in its texts or to advertise in its GPU lock."""
        return ""

    def answers(self) -> bool:
        if self.registered() >= self.expected:
            return True
        now = time.monotonic()
        if now - self._probed >= HEAD_PROBE_S:
            self._probed = now
            state = probe_tcp(*self.head)
            self._head_seen = self._head_seen or state == REACHABLE
            if state == REFUSED and self._head_seen:
                self._give_up(f"the head's registration port {self.head[0]}:{self.head[1]} refuses connections")
        return False

    def registered(self) -> int:
        """Replicas of this run that registered with the head (its log follower's lines: answers() runs
        on every readiness poll and must not read the log again)."""
        return self.registrations.count() if self.registrations is not None else 0

    def healthy(self, timeout: float) -> bool:
        return True     # no /health: the process watch and the head watch (JoinRole.watch) cover it

    def _give_up(self, why: str) -> None:
        text = f"vllm-omni-launcher: {why} while this replica started; stopping it so that it registers again\n"
        try:
            fd = private_files.open_private(self.log_path)        # appends, never through a link
            try:
                private_files.write_all(fd, text.encode(), self.log_path)
            finally:
                os.close(fd)
        except OSError:
            pass
        self.stop(graceful=False, timeout=5.0)


class Registrations:
    """The replica ids the registration lines of a run's log name, counted from the segments its log
    follower already delivers (one pass over the log: the follower reads each byte once and hands on
    complete lines; a redrawn progress bar, the only partial segment, never holds this line)."""

    def __init__(self, on_segment: Callable[[str, bool], None]) -> None:
        self._on_segment = on_segment
        self._ids: set[str] = set()

    def segment(self, text: str, ends_line: bool) -> None:
        """The follower's callback: note registrations, then pass the segment on."""
        if ends_line:
            self._ids.update(m.group(1) for m in REPLICA_REGISTERED.finditer(text))
        self._on_segment(text, ends_line)

    def count(self) -> int:
        return len(self._ids)


def _copies(spec: LaunchSpec) -> str:
    return f"{spec.replicas} replicas" if spec.replicas > 1 else "1 replica"


def head_stalled(seconds: float, waiting: int, timeout_s: float, tail: list[str]) -> ServerFailure:
    return ServerFailure(
        failures.HUNG, f"The head made no progress for {seconds:.0f} s while {waiting} job(s) waited",
        "vLLM-Omni's head wedges when a remote replica dies (its orchestrator blocks for good shutting down the "
        "lost replica's socket): jobs stay queued or in progress and /health stays 200",
        f"nothing, the launcher restarts the head and the joined replicas register again; if jobs on a remote "
        f"replica legitimately take longer than {timeout_s:g} s, raise head_stall_timeout_s in the launcher config",
        setting="head_stall_timeout_s", raw="\n".join(tail))


def head_lost(host: str, port: int, how: str, tail: list[str]) -> ServerFailure:
    what = "refuses connections" if how == REFUSED else "does not answer"
    return ServerFailure(
        failures.CRASH, f"The head's registration port {host}:{port} {what}",
        "the head this replica registered with is gone (or restarting); a replica of an exited head keeps its "
        "old sockets and would never get a job again",
        "nothing, the launcher restarts this replica, which registers again once the head is back; if the head "
        "moved, restart serve --join with its new address", setting="--join", raw="\n".join(tail))

