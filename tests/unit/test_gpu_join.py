"""The pure parts of issue 17's head + joined-replica bench (phase J of bench/gpu_session.sh): which
runtime ran each job from the head's log, the joined runtime's finished denoise bars, the evidence
lines, GPU memory per runtime, and the README table. The driver itself (bench/gpu_join.py) is
rehearsed end to end by `bash bench/gpu_session.sh cpu-j` (stub server)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gpu_join_report as rep  # noqa: E402  (bench/ is no package; standard library only)


# The head's log as vLLM-Omni writes it (0.26 and 0.30 alike): its own replica 0, a joined replica
# attached as replica 1, jobs routed round-robin.
HEAD_LOG = """\
(APIServer pid=7) INFO [membership_controller.py:261] [MembershipController] attached remote replica stage=0 replica=1 addr=tcp://127.0.0.1:40001
(APIServer pid=7) INFO [stage_diffusion_client.py:348] [StageDiffusionClient] stage-0 [rep-0] add request: video_gen_aaa
(APIServer pid=7) INFO [stage_diffusion_client.py:348] [StageDiffusionClient] stage-0 [rep-1] add request: video_gen_bbb
(APIServer pid=7) INFO [stage_diffusion_client.py:348] [StageDiffusionClient] stage-0 [rep-0] add request: video_gen_ccc
"""


def test_jobs_on_an_attached_remote_replica_ran_in_the_joined_runtime_and_the_rest_on_the_head() -> None:
    runtime = rep.runtime_of_jobs(HEAD_LOG, ["video_gen_aaa", "video_gen_bbb", "video_gen_ccc", "video_gen_zzz"])
    assert runtime == {"video_gen_aaa": "head", "video_gen_bbb": "joined", "video_gen_ccc": "head",
                       "video_gen_zzz": None}
    assert rep.jobs_per_runtime(runtime) == {"head": 2, "joined": 1, "unknown": 1}


def test_a_replica_attached_by_a_later_head_generation_counts_as_joined() -> None:
    later = HEAD_LOG + ("[MembershipController] attached remote replica stage=0 replica=2 addr=tcp://x\n"
                        "[StageDiffusionClient] stage-0 [rep-2] add request: video_gen_ddd-a58\n")
    assert rep.remote_replicas(later) == {1, 2}
    assert rep.runtime_of_jobs(later, ["video_gen_ddd"]) == {"video_gen_ddd": "joined"}


def test_without_attach_lines_replica_ids_past_the_heads_own_count_as_joined() -> None:
    log = "".join(line + "\n" for line in HEAD_LOG.splitlines() if "attached" not in line)
    assert rep.runtime_of_jobs(log, ["video_gen_aaa", "video_gen_bbb"]) == {"video_gen_aaa": "head",
                                                                            "video_gen_bbb": "joined"}
    assert rep.runtime_of_jobs(log, ["video_gen_bbb"], local_replicas=2) == {"video_gen_bbb": "head"}


def test_the_joined_runtimes_finished_bars_of_the_jobs_step_count_are_counted_once_each() -> None:
    bar = "\r  0%|          | 0/4 [00:00<?, ?it/s]\r100%|##########| 4/4 [00:01<00:00, 3.99it/s]"
    log = ("\r  0%|          | 0/1 [00:00<?, ?it/s]\r100%|##########| 1/1 [00:53<00:00, 53.46s/it]"
           "\r100%|##########| 1/1 [00:53<00:00, 53.46s/it]\n"                      # warm-up: 1 step, closed
           + bar + "\n\r100%|##########| 4/4 [00:01<00:00, 3.99it/s]\n"             # tqdm's close: same bar
           + bar + "\n"                                                            # the next job: same text
           "\r 50%|#####     | 2/4 [00:00<00:00, 9.1it/s]\n"                        # a job still running
           "Loading weights: 100%|##########| 22/22 [00:00<00:00, 3506.14it/s]\n")
    assert rep.finished_runs(log, 4) == 2
    assert rep.finished_runs(log, 1) == 1
    assert rep.finished_runs(log, 6) == 0


def test_evidence_keeps_registration_routing_and_launcher_lines_without_colours() -> None:
    log = ("\x1b[1;36m(StageDiffusionProc pid=9)\x1b[0m INFO StageDiffusionProc registered with OmniCoordinator "
           "(stage_id=0 replica_id=1 coord=tcp://127.0.0.1:29555)\nINFO unrelated line\n"
           "vllm-omni-launcher: the head's registration port refuses connections while this replica started\n")
    assert rep.evidence(log) == [
        "(StageDiffusionProc pid=9) INFO StageDiffusionProc registered with OmniCoordinator (stage_id=0 "
        "replica_id=1 coord=tcp://127.0.0.1:29555)",
        "vllm-omni-launcher: the head's registration port refuses connections while this replica started"]
    many = "\n".join(f"[rep-0] add request: job{i}" for i in range(30))
    cut = rep.evidence(many, limit=6)
    assert cut[:3] == [f"[rep-0] add request: job{i}" for i in range(3)] and cut[3] == "..." and len(cut) == 7


def test_gpu_memory_is_split_by_the_process_group_each_pid_belongs_to() -> None:
    by_pid = {101: 1500, 202: 1400, 203: 300, 999: 10}         # gpu_replicas.gpu_mib_by_pid of nvidia-smi's lines
    assert rep.gpu_mib_by_runtime(by_pid, {"head": [100, 101], "joined": {202, 203}}) == {
        "head": 1500, "joined": 1700, "other": 10}


REPORT = {
    "bench": "gpu_join", "label": "tiny-ti2v", "command": "python bench/gpu_join.py --vllm",
    "server": "real vLLM-Omni server", "server_versions": {"vllm": "0.26.0", "vllm_omni": "0.26.0"},
    "request": "480x320, 33 frames, one seed per job", "denoise_steps": 10, "stall_s": 25, "deadline_s": 320,
    "machine": {"gpu": "NVIDIA H200, 143771 MiB"},
    "steps": {"head": {"status": "ok", "t_s": 71.2, "registration_port_open_s": 12.0},
              "join": {"status": "ok", "t_s": 80.5, "head_attached_s": 81.0},
              "jobs": {"status": "ok", "t_s": 95.0, "jobs_per_runtime": {"head": 1, "joined": 1},
                       "per_job": [{"job": "a", "runtime": "head"}, {"job": "b", "runtime": None}],
                       "gpu_memory": {"by_runtime_mib": {"head": 1500, "joined": 1700}}},
              "kill": {"status": "skipped: needs ~160 s, 90 s left"},
              "after": {"status": "skipped: the restart step did not finish"},
              "stop": {"status": "ok", "t_s": 100.0, "left_after_stop": [], "note": "a|b"}},
}


def test_the_readme_has_a_row_per_step_with_its_status_time_and_details(tmp_path: Path) -> None:
    (tmp_path / "tiny-ti2v.json").write_text(json.dumps(REPORT))
    (tmp_path / "other.json").write_text(json.dumps({"bench": "throughput_bench"}))
    (tmp_path / "broken.json").write_text("{")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_join_report.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "README.md").read_text()
    assert "vllm 0.26.0, vllm-omni 0.26.0" in text and "head_stall_timeout_s 25" in text
    assert "| 1. head ready (head role, own replica on GPU 0) | ok | 71.2 | registration_port_open_s 12.0 |" in text
    assert "480x320, 33 frames, one seed per job, 10 steps" in text
    assert '| 3. jobs through the head | ok | 95.0 | jobs_per_runtime {"head": 1, "joined": 1} |' in text
    assert "- jobs: runtime of each job in submit order: head, unknown" in text
    assert '- jobs: GPU memory by runtime (MiB): {"head": 1500, "joined": 1700}' in text
    assert "| 4. kill -9 of the joined runtime, restarts | skipped: needs ~160 s, 90 s left | - |  |" in text
    assert 'note "a/b"' in text                              # a pipe in a detail cannot break the table
    assert text.count("## ") == 1                             # only gpu_join reports
