"""The pure parts of issue 17's one-GPU replica bench (phase R of bench/gpu_session.sh): the shim that
folds upstream's replica device pool onto GPU 0, reading which replica ran each job from the server
log, GPU memory per process, the deadline rule, and the README table. The bench itself is rehearsed
end to end by `bash bench/gpu_session.sh cpu-r` (stub server)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


shim = _load("gpu_replicas_shim")
rep = _load("gpu_replicas")
bench = _load("throughput_bench")

# What our spec writes for 2 replicas of a 1-GPU layout (server/launch/replicas.py) and of a 2-GPU one.
TWO_OF_ONE = '{"0":{"num_replicas":2,"devices":"0,1"}}'
TWO_OF_TWO = '{"0":{"num_replicas":2,"devices":"0,1,2,3"}}'


def test_shim_folds_the_device_pool_onto_the_first_replicas_gpus():
    argv = ["/py", "-c", "main", "serve", "m", "--omni", "--stage-overrides", TWO_OF_ONE, "--port", "1"]
    out = shim.one_gpu_argv(argv)
    assert json.loads(out[7]) == {"0": {"num_replicas": 2, "devices": "0,0"}}
    assert out[:7] + out[8:] == argv[:7] + argv[8:], "nothing else of the argv changes"
    assert json.loads(shim.one_gpu_argv(["x", "--stage-overrides", TWO_OF_TWO])[2])["0"]["devices"] == "0,1,0,1"


def test_shim_leaves_a_one_replica_argv_alone():
    argv = ["/py", "serve", "m", "--omni", "--enforce-eager"]
    assert shim.one_gpu_argv(argv) == argv
    single = ["/py", "--stage-overrides", '{"0":{"num_replicas":1,"devices":"3"}}']
    assert json.loads(shim.one_gpu_argv(single)[2]) == {"0": {"num_replicas": 1, "devices": "3"}}


def test_shim_execs_the_program_with_the_rewritten_argv():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_replicas_shim.py"), "/bin/echo",
                           "serve", "--stage-overrides", TWO_OF_ONE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == 'serve --stage-overrides {"0":{"num_replicas":2,"devices":"0,0"}}'
    assert "[gpu_replicas_shim] one GPU for all replicas" in done.stderr


LOG_026 = """\
(APIServer pid=7) INFO 12-01 [stage_init_utils.py:670] [stage_init] Stage 0: 2 replicas, devices_per_replica=1, devices split: ['0', '0']
(APIServer pid=7) INFO 12-01 [stage_diffusion_client.py:143] [StageDiffusionClient] stage-0 [rep-0] initialized (owns_process=True, batch_size=1)
(APIServer pid=7) INFO 12-01 [stage_diffusion_client.py:341] [StageDiffusionClient] stage-0 [rep-0] add request: video_gen_aaa
(APIServer pid=7) INFO 12-01 [stage_diffusion_client.py:341] [StageDiffusionClient] stage-0 [rep-1] add request: video_gen_bbb
\x1b[32m(APIServer pid=7) INFO 12-01 [stage_diffusion_client.py:341] [StageDiffusionClient] stage-0 [rep-0] add request: 0_video_gen_ccc\x1b[0m
"""


def test_replica_of_each_job_comes_from_upstreams_add_request_lines():
    got = rep.replica_of_jobs(LOG_026, ["video_gen_aaa", "video_gen_bbb", "video_gen_ccc", "video_gen_zzz"], 2)
    assert got == {"video_gen_aaa": 0, "video_gen_bbb": 1, "video_gen_ccc": 0, "video_gen_zzz": None}
    assert rep.jobs_per_replica(got) == {"0": 2, "1": 1, "unknown": 1}


def test_one_replica_ran_every_job_without_a_log_line():
    assert rep.replica_of_jobs("", ["video_gen_aaa", "video_gen_bbb"], 1) == {"video_gen_aaa": 0, "video_gen_bbb": 0}


def test_log_evidence_keeps_the_device_split_and_replica_lines():
    lines = rep.log_evidence(LOG_026)
    assert len(lines) == 2
    assert lines[0].endswith("devices split: ['0', '0']") and "[rep-0] initialized" in lines[1]
    colour = "\x1b[0;36m(APIServer pid=7)\x1b[0;0m INFO [stage_init] Stage 0: 2 replicas, devices_per_replica=1, " \
             "devices split: ['0', '0']\n"
    assert rep.log_evidence(colour) == ["(APIServer pid=7) INFO [stage_init] Stage 0: 2 replicas, "
                                        "devices_per_replica=1, devices split: ['0', '0']"]


def test_gpu_memory_by_pid_reads_nvidia_smi_and_ignores_cpu_markers():
    assert rep.gpu_mib_by_pid(["4242, 1530 MiB", "4250, 1402 MiB", "garbage"]) == {4242: 1530, 4250: 1402}
    assert rep.gpu_mib_by_pid("not measured on CPU") == {}


def test_a_setting_is_skipped_when_the_deadline_cannot_hold_it():
    clock = bench.Clock(200.0)
    rows = [{"replicas": 1, "start_to_ready_s": 60.0, "wall_s": 10.0}]
    assert bench.fits(rows, 2, clock) is None            # 1.5 x 60 + 15 + 30 fits in 200 s
    tight = bench.Clock(100.0)
    assert bench.fits(rows, 2, tight).startswith("skipped: needs ~135 s")
    assert bench.fits([], 1, tight) is None, "the first setting always runs"
    assert bench.fits(rows, 2, bench.Clock(None)) is None


def test_one_gpu_mode_puts_the_shim_in_front_of_the_server_program(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = bench.argparse.Namespace(server_cmd="/venv/bin/python /stub.py", vllm=False, one_gpu=True, step_s=0.1)
    cmd, env, what = bench.servers(args)
    assert cmd == ["/venv/bin/python", str(REPO / "bench" / "gpu_replicas_shim.py"), "/venv/bin/python", "/stub.py"]
    assert bench.os.environ["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_OMNI_STUB_STEP_S"] == "0.1"
    assert what == "server command /venv/bin/python /stub.py"


def _report(label, rows, **extra):
    return {"bench": "throughput_bench", "label": label, "command": "python bench/throughput_bench.py --vllm",
            "server": "real vLLM-Omni server", "server_versions": {"vllm": "0.26.0", "vllm_omni": "0.26.0"},
            "request": "480x320, 33 frames, one seed per job", "steps": 10, "jobs": 8, "poll_s": 0.2,
            "layout": "every replica on GPU 0", "machine": {"gpu": "NVIDIA H200, 143771 MiB"}, "results": rows,
            **extra}


def test_readme_has_a_row_per_setting_with_split_memory_and_stop_check(tmp_path):
    one = {"replicas": 1, "start_to_ready_s": 61.2, "jobs": 8, "wall_s": 12.0, "jobs_per_min": 40.0,
           "speedup_vs_first": 1.0, "job_s": [1.5, 3.0], "jobs_per_replica": {"unknown": 8},
           "nvml_peak_mib": 1536, "processes": {"replica_pids": [], "left_after_stop": []},
           "gpu_mib_by_pid": {11: 1500}}
    two = {**one, "replicas": 2, "wall_s": 8.0, "jobs_per_min": 60.0, "speedup_vs_first": 1.5,
           "jobs_per_replica": {"0": 4, "1": 4}, "processes": {"replica_pids": [21, 22], "left_after_stop": [22]}}
    (tmp_path / "tiny.json").write_text(json.dumps(_report("tiny-ti2v", [one, two])))
    (tmp_path / "full.json").write_text(json.dumps(_report("ti2v-5b", [one, {"replicas": 2, "skipped": "skipped: x"}],
                                                           interrupted="SIGINT during setting 2")))
    (tmp_path / "other.json").write_text(json.dumps({"bench": "overhead"}))
    assert rep.main([str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "| tiny-ti2v | 2 | 61.2 | 8 in 8.0 s | 60.0 | 1.5x | 1.5, 3.0 | rep 0: 4, rep 1: 4 | 1.5 | 2 found, 1 LEFT |" \
        in text
    assert "| tiny-ti2v | 1 | 61.2 | 8 in 12.0 s | 40.0 | 1.0x | 1.5, 3.0 | rep unknown: 8 | 1.5 | 0 found, none left |" \
        in text
    assert "| ti2v-5b | 2 | skipped: x |" in text and "**Cut short**: SIGINT during setting 2" in text
    assert "vllm 0.26.0, vllm-omni 0.26.0" in text and "overhead" not in text
