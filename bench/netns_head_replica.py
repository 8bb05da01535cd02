"""A head and a joined replica on two boxes (this machine's network namespace and one of the replica's own,
joined by a veth pair: tests/contract/two_boxes.py), through
our own roles, with the stub as their `vllm` (real vLLM-Omni 0.30, fake GPU): the network facts and
faults that cost a restart, so they are run by hand rather than in CI (tests/contract/test_join_head.py
runs registration, routing, a blocked registration port, a short cable loss and a kill on every CI run).

0. VLLM_PORT in the head's environment (vLLM's way to pick its ports from a known number upward), to
   narrow the per-replica ports: what a replica's registration does to that head;
1. ports: what the head listens on, and which of the head's ports the joined runtime connects to;
2. a firewall that lets the replica box reach only the registration port and the ephemeral port range
   (net.ipv4.ip_local_port_range) of the head (egress rules on the replica box): registration and jobs;
3. the same firewall without the ephemeral range (the registration port alone): what the replica does;
4. a pulled cable for longer than upstream's 30 s heartbeat: both sides' timeline until a job runs on
   the replica again.

Each of phases 2 and 3 starts a fresh head: a replica that leaves (even `join.stop()`, a clean stop)
wedges upstream's head about 30 s later (its heartbeat timeout, then the blocking detach of
docs/replicas.md section 3), and a replica that registers with a wedged head is never attached.

Needs root and `ip` (as the test); about 10 minutes on a 2-core box. Prints a report (and --out JSON):
    sudo VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=$PWD/.venv-server/bin/python \\
        .venv/bin/python bench/netns_head_replica.py --out bench/results/netns-head-replica/report.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))

import stubserver  # noqa: E402
from two_boxes import ESTABLISHED, LISTEN, Boxes, tcp_sockets  # noqa: E402

from vllm_omni_launcher.server.process import probe, process_group  # noqa: E402
from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402
from vllm_omni_launcher.server.supervision.multi_host import HeadRole, JoinRole  # noqa: E402
from vllm_omni_launcher.server.registry import Status, Supervisor  # noqa: E402
from vllm_omni_launcher.server.launch.spec import LaunchSpec  # noqa: E402

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
VLLM_PORT = 29600
T0 = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {text}", flush=True)


def config(where: Path, **changes: Any) -> LocalConfig:
    env = {"VLLM_OMNI_STUB_STEP_S": "0.2", "CUDA_VISIBLE_DEVICES": "0", **changes.pop("env", {})}
    return LocalConfig(server_command=(stubserver.server_python(), str(stubserver.STUB_SCRIPT)), data_dir=str(where),
                       gpu_lock_dir=str(where / "gpu-locks"), startup_timeout_s=changes.pop("startup_timeout_s", 900.0),
                       extra_env=env, **changes)


def tcp(sup: Supervisor, state: str) -> list[tuple[str, int]]:
    """(ip, port) of the supervisor's processes' TCP sockets in `state`: the local end of a listener,
    the remote end of a connection."""
    pids = [p.pid for p in process_group.group_members(sup.pgid or 0)]
    return sorted({(lip, lport) if state == LISTEN else (rip, rport)
                   for lip, lport, rip, rport in tcp_sockets(pids, state)})


def job(head: Supervisor, steps: int, seed: int) -> str:
    """Submit one job, waiting (up to 15 min) while the head restarts."""
    import requests
    fields = {"prompt": "a red fox in snow", "width": "256", "height": "128", "num_frames": "9", "fps": "16",
              "num_inference_steps": str(steps), "seed": str(seed)}
    end = time.monotonic() + 900
    while True:
        head.wait_ready(max(1.0, end - time.monotonic()))
        try:
            r = requests.post(f"{head.url}/v1/videos", files={k: (None, v) for k, v in fields.items()},
                              headers={"Authorization": f"Bearer {head.api_key}"}, timeout=60)
            break
        except requests.ConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(1.0)
    r.raise_for_status()
    head.mark_job_activity()
    return r.json()["id"]


def job_status(head: Supervisor, job_id: str) -> Optional[str]:
    import requests
    try:
        r = requests.get(f"{head.url}/v1/videos/{job_id}", headers={"Authorization": f"Bearer {head.api_key}"},
                         timeout=10)
        return r.json().get("status") if r.status_code == 200 else f"http {r.status_code}"
    except requests.RequestException as exc:
        return type(exc).__name__


def until(what: str, check: Callable[[], Any], timeout: float, every: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(every)
    say(f"gave up waiting ({timeout:.0f} s) for {what}")
    return None


def joined_runs_a_job(head: Supervisor, join: Supervisor, seed: int, timeout: float = 240) -> bool:
    """Pairs of jobs until the joined replica ran one (round-robin puts one on each), or the timeout."""
    end = time.monotonic() + timeout
    before = join.progress().run_id if join.progress() else -1
    while time.monotonic() < end:
        ids = [job(head, 3, seed), job(head, 3, seed + 1)]
        seed += 2
        until("the pair to complete", lambda: all(job_status(head, j) == "completed" for j in ids),
              max(5.0, end - time.monotonic()))
        if until("the joined replica's job", lambda: (p := join.progress()) and p.run_id > before and p.done, 10):
            return True
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--cut-s", type=float, default=75.0, help="phase 4's outage (upstream's heartbeat: 30 s)")
    ap.add_argument("--only-cut", action="store_true", help="phase 4 alone")
    args = ap.parse_args()
    boxes, why = Boxes.make()
    if boxes is None:
        print(f"cannot make the two boxes: {why}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"head": boxes.head_address, "replica": boxes.replica_address}
    work = Path(f"/tmp/netns-head-replica-{time.strftime('%Y%m%d-%H%M%S')}")
    reg = probe.free_port()
    head_seen: list[tuple[float, Status]] = []
    join_seen: list[tuple[float, Status]] = []

    def on_head(s: Status) -> None:
        head_seen.append((time.monotonic() - T0, s))

    def on_join(s: Status) -> None:
        join_seen.append((time.monotonic() - T0, s))

    def new_head(name: str, **changes: Any) -> Supervisor:
        cfg = config(work / name, replica_registration_host=boxes.head_address, head_stall_timeout_s=25.0,
                     **changes)
        # phase 0's head is built past HeadRole.from_config, which now refuses VLLM_PORT because of it
        role = HeadRole(boxes.head_address, reg, 25.0) if "VLLM_PORT" in cfg.extra_env else \
            HeadRole.from_config(reg, cfg)
        return Supervisor(LaunchSpec(TI2V, gpus=(0,), host=boxes.head_address), cfg, role=role)
    head = new_head("head-vllm-port", env={"VLLM_PORT": str(VLLM_PORT)})

    def end_phase(old: Supervisor, joined: Supervisor, name: str) -> Supervisor:
        """Stop the phase's replica, lift its firewall, and start a fresh head (a left replica wedges it)."""
        joined.stop()
        boxes.unblock()
        old.stop()
        fresh = new_head(name)
        fresh.start(on_status=on_head, timeout=900)
        return fresh

    joins = [0]

    def new_join(**changes: Any) -> Supervisor:
        joins[0] += 1
        cfg = config(work / f"join-{joins[0]}", hang_timeout_s=20.0, **changes)
        return Supervisor(LaunchSpec(TI2V, gpus=(0,)), cfg, api_key=False,
                          role=JoinRole.from_config(f"{boxes.head_address}:{reg}", cfg))
    join = new_join()
    try:
        say(f"head box {boxes.head_address}, replica box {boxes.replica_address}, registration port {reg}")
        if args.only_cut:
            head = new_head("head-4")
            head.start(on_status=on_head, timeout=900)
        else:
            # -- 0. VLLM_PORT on the head
            head.start(on_status=on_head, timeout=900)
            say(f"0. head with VLLM_PORT={VLLM_PORT}: {head.status().text}")
            try:
                boxes.run_in(join.start, on_status=on_join, timeout=300)
                report["0_outcome"] = f"joined: {join.status().text}"
            except Exception as exc:                               # noqa: BLE001 - the finding
                report["0_outcome"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            log = Path(head.log_path or "").read_text(errors="replace").splitlines()
            crash = [line.split("] ", 1)[-1] for line in log
                     if "Could not allocate" in line or "Server thread crashed" in line]
            report["0_head_log"] = crash[-2:]
            say(f"   the replica: {report['0_outcome']}")
            say(f"   the head's log: {report['0_head_log']}")
            join.stop()
            head.stop()
            head = new_head("head")
            join = new_join()
            head.start(on_status=on_head, timeout=900)
            boxes.run_in(join.start, on_status=on_join, timeout=900)
            say(f"joined (no VLLM_PORT): {join.status().text}")
            # -- 1. ports
            listening = tcp(head, LISTEN)
            used = tcp(join, ESTABLISHED)
            report["1_head_listens"] = listening
            report["1_replica_connects_to"] = used
            say(f"1. the head listens on {listening}")
            say(f"   the joined runtime's connections go to {used}")
            head_ports = sorted({p for ip, p in used if ip == boxes.head_address} - {reg})
            report["1_per_replica_ports"] = head_ports
            low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
            report["1_ephemeral_range"] = [low, high]
            say(f"   the head's ports it uses besides registration: {head_ports} (all in the ephemeral range "
                f"{low}-{high}: {all(low <= p <= high for p in head_ports)})")
            report["1_routed"] = joined_runs_a_job(head, join, seed=1)
            say(f"   a job ran on the joined replica: {report['1_routed']}")

            # -- 2. a firewall: the replica box reaches only the registration port and the ephemeral range
            join.stop()
            head.stop()                                            # a left replica wedges it (see above)
            head = new_head("head-2")
            head.start(on_status=on_head, timeout=900)
            closed = _complement([reg, *range(low, high + 1)])
            boxes.block(closed)
            say(f"2. firewall: the replica box reaches only {reg} and {low}-{high} on the head (refused: {closed})")
            join = new_join()
            boxes.run_in(join.start, on_status=on_join, timeout=900)
            report["2_ready"] = join.ready()
            report["2_routed"] = joined_runs_a_job(head, join, seed=11)
            say(f"   joined: {join.status().text}; a job ran on it: {report['2_routed']}")
            head = end_phase(head, join, "head-3")

            # -- 3. the registration port alone
            boxes.block(_complement([reg]))
            say(f"3. firewall: the replica box reaches only the registration port {reg} (per-replica ports refused)")
            join = new_join(startup_timeout_s=150.0)
            t = time.monotonic()
            try:
                boxes.run_in(join.start, on_status=on_join, timeout=150)
                report["3_outcome"] = f"ready: {join.status().text}"
            except Exception as exc:                               # noqa: BLE001 - the finding
                report["3_outcome"] = f"{type(exc).__name__}: {exc}"
            report["3_seconds"] = round(time.monotonic() - t, 1)
            say(f"   after {report['3_seconds']} s: {report['3_outcome']}")
            head = end_phase(head, join, "head-4")

        # -- 4. a pulled cable for longer than the heartbeat
        join = new_join()
        boxes.run_in(join.start, on_status=on_join, timeout=900)
        joined_runs_a_job(head, join, seed=21)
        gens = (head.generation, join.generation)
        boxes.cut()
        cut_at = time.monotonic()
        say(f"4. cable of the replica box pulled for {args.cut_s:.0f} s (head gen {gens[0]}, replica gen {gens[1]})")
        waiting = [job(head, 3, 31), job(head, 3, 32)]
        time.sleep(args.cut_s)                                 # the outage is the experiment's parameter
        boxes.mend()
        say("   cable back")
        back = until("a job on the joined replica again", lambda: joined_runs_a_job(head, join, seed=41, timeout=120),
                     900, every=1.0)
        report["4_recovered_s_after_mend"] = round(time.monotonic() - cut_at - args.cut_s, 1)
        report["4_recovered"] = bool(back)
        report["4_generations"] = {"head": [gens[0], head.generation], "replica": [gens[1], join.generation]}
        report["4_jobs_sent_during_the_outage"] = {j: job_status(head, j) for j in waiting}
        say(f"   recovered: {bool(back)}, {report['4_recovered_s_after_mend']} s after the cable came back; "
            f"generations {report['4_generations']}; jobs sent while cut: {report['4_jobs_sent_during_the_outage']}")
    finally:
        join.stop()
        head.stop()
        boxes.close()
        report["timeline_head"] = _timeline(head_seen)
        report["timeline_replica"] = _timeline(join_seen)
        report["logs"] = str(work)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    for name in ("timeline_head", "timeline_replica"):
        print(f"\n{name}:")
        for line in report[name]:
            print(f"  {line}")
    return 0


def _complement(open_ports: list[int]) -> list[str]:
    """dport ranges covering every TCP port except `open_ports` (up to 65534: iproute2 refuses a range
    that ends at 65535, "Invalid dport range")."""
    out, low = [], 1
    for port in sorted(set(open_ports)):
        if port > low:
            out.append(f"{low}-{port - 1}")
        low = port + 1
    return out + ([f"{low}-65534"] if low <= 65534 else [])


def _timeline(seen: list[tuple[float, Status]]) -> list[str]:
    out: list[str] = []
    for at, s in seen:
        line = f"gen {s.generation} {s.phase}: {s.text}"
        if not out or not out[-1].endswith(line):
            out.append(f"{at:7.1f} s {line}")
    return out


if __name__ == "__main__":
    sys.exit(main())
