"""`python -m vllm_omni_launcher plan` and `doctor`: the done-when recommendations through the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_omni_launcher.cli import main
from vllm_omni_launcher.planner.memory import RequestShape, plan
from vllm_omni_launcher.server.launch.spec import LaunchSpec

CASES = [
    ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", 1280, 704, 121, "24"),
    ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", 832, 480, 81, "24,24"),
    ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", 1280, 720, 81, "80"),
    ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", 1280, 720, 81, "141,141"),
]


@pytest.mark.parametrize("model,w,h,f,mem", CASES)
def test_plan_json_recommends_a_fitting_valid_spec(capsys, model, w, h, f, mem):
    rc = main(["plan", "--model", model, "--width", str(w), "--height", str(h), "--frames", str(f),
               "--gpu-memory", mem, "--host-ram", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    rec = out["recommendation"]
    assert rec and rec["spec"] and not rec["reduced"]
    spec = LaunchSpec.from_dict(rec["spec"])
    gpus = [float(x) for x in mem.split(",")]
    spec.validate(visible_gpus=len(gpus))
    assert plan(spec, RequestShape(w, h, f), gpus[:spec.parallel.world_size], host_available_gib=256).fits
    assert rec["plan"]["fits"] is True
    assert out["plan"]["gpus"][0]["terms"]     # the breakdown of the given (default) spec


def test_plan_text_shows_breakdown_and_why(capsys):
    rc = main(["plan", "--model", "Wan-AI/Wan2.2-I2V-A14B-Diffusers", "--width", "1280", "--height", "720",
               "--frames", "81", "--gpu-memory", "80", "--host-ram", "256"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "DiT weights" in text and "text encoder" in text and "VAE decode" in text
    assert "DOES NOT FIT" in text and "Recommended:" in text and "not 1 GPU, no offload" in text


def test_plan_prints_each_recommendation_warning_once_after_its_text(capsys):
    """The recommendation's text carries no warning; `plan` gives each of its warnings as one `warning:` line."""
    args = ["plan", "--model", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "--gpu-memory", "141", "--host-ram", "64",
            "--speed", "fast"]
    assert main([*args, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["recommendation"]["warnings"]
    assert any(w.startswith("speed fast: FP8 DiT weights") for w in warnings)
    assert main(args) == 0
    shown = capsys.readouterr().out.split("== recommendation ==")[1].splitlines()
    assert [ln for ln in shown if ln.startswith("warning")] == [f"warning: {w}" for w in warnings]
    assert shown[-len(warnings):] == [f"warning: {w}" for w in warnings]


def test_plan_no_cfg_and_geforce(capsys):
    main(["plan", "--model", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "--width", "832", "--height", "480", "--frames",
          "81", "--gpu-memory", "2x24", "--gpu-name", "NVIDIA GeForce RTX 4090", "--p2p", "no", "--host-ram", "64",
          "--json"])
    rec = json.loads(capsys.readouterr().out)["recommendation"]
    assert rec["spec"]["parallel"]["mode"] == "cfg"
    main(["plan", "--model", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "--no-cfg", "--gpu-memory", "141,141", "--json"])
    rec = json.loads(capsys.readouterr().out)["recommendation"]
    assert rec["spec"]["parallel"]["mode"] == "ulysses"


def test_plan_rejects_a_bad_request_as_a_launcher_error_and_bad_sizes_as_usage(capsys):
    assert main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--frames", "80", "--gpu-memory", "80"]) == 1
    assert "4k+1" in capsys.readouterr().err
    assert main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--gpu-memory", "lots"]) == 2
    assert 'argument --gpu-memory: the string "lots" is not a size' in capsys.readouterr().err


def test_plan_exits_3_when_nothing_fits_and_says_why(capsys):
    rc = main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--width", "832", "--height", "480",
               "--frames", "81", "--gpu-memory", "24,24", "--host-ram", "48"])
    out = capsys.readouterr().out
    assert rc == 3
    assert "No configuration fits" in out and "host RAM needs" in out


def test_readme_plan_example_recommends_tensor_parallel_with_offload(capsys):
    # The README's example, with the host RAM it states; the module offload needs about 78 GiB of it.
    rc = main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--width", "832", "--height", "480",
               "--frames", "81", "--gpu-memory", "24,24", "--host-ram", "96"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--tensor-parallel-size 2 --vae-patch-parallel-size 2 --enable-cpu-offload" in out


def test_plan_no_recommend_with_an_invalid_spec_is_a_launcher_error(capsys):
    rc = main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--parallel", "cfg=3", "--gpu-memory",
               "141,141", "--no-recommend", "--json"])
    err = json.loads(capsys.readouterr().out)["error"]
    assert rc == 1 and "CFG parallel degree 3" in err["what"] and err["setting"] == "parallel_degree"


def test_plan_with_invalid_given_spec_still_recommends(capsys):
    rc = main(["plan", "--model", "Wan-AI/Wan2.2-T2V-A14B-Diffusers", "--parallel", "cfg=3", "--gpu-memory",
               "141,141", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["spec_error"]["setting"] == "parallel_degree" and "not 2" in out["spec_error"]["what"]
    assert out["plan"] is None and out["recommendation"]["spec"]
    assert rc == 0


def test_doctor_cli_runs_on_this_machine_and_exits_4_on_a_problem(tmp_path):
    env = dict(os.environ, VLLM_OMNI_LAUNCHER_CONFIG=str(tmp_path / "none.json"),
               VLLM_OMNI_LAUNCHER_SERVER_ENV=str(tmp_path / "no-env"))
    proc = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "doctor", "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    report = json.loads(proc.stdout)
    names = {c["name"] for c in report["checks"]}
    assert {"gpus", "server_env", "port", "host_ram"} <= names
    assert report["problems"] >= 1 and proc.returncode == 4     # the missing server env is a problem
    text = subprocess.run([sys.executable, "-m", "vllm_omni_launcher", "doctor"], capture_output=True, text=True,
                          env=env, timeout=120).stdout
    assert "could not run" in text or "problem(s)" in text
