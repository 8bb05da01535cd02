"""The README's Quick start as a new user meets it: first after the opening paragraph, the install line's
package list the one requirements.txt installs, and a ComfyUI-Manager install pointed at a server-environment
script that exists and takes the options the README names."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _quick_start() -> str:
    return README.split("## Quick start\n", 1)[1].split("\n## ", 1)[0]


def test_quick_start_follows_the_title_and_the_opening_paragraph():
    title, paragraph, *more = [block for block in README.split("## Quick start\n", 1)[0].split("\n\n") if block.strip()]
    assert title.startswith("# ") and not more, more[:1]


def test_the_install_lines_package_list_is_requirements_txt():
    names = [re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]
             for line in (REPO / "requirements.txt").read_text().splitlines() if line.strip()
             and not line.startswith("#")]
    listed = re.search(r"pip install -e \S+ +# light: (.+)", _quick_start())[1]
    assert listed.split(", ") == names


def test_a_manager_install_is_told_how_to_make_the_server_environment():
    section = _quick_start()
    command = re.search(r"`bash custom_nodes/vllm-omni-launcher/(server/create_server_env\.sh)`", section)
    assert "No module named vllm_omni_launcher" in section and command
    usage = subprocess.run(["bash", str(REPO / command[1]), "--help"], capture_output=True, text=True, check=True)
    for option in ("--python", "--version", "PATH"):
        assert option in usage.stdout
