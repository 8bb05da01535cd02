"""What the Comfy Registry and ComfyUI-Manager read from the repository: pyproject.toml,
requirements.txt, LICENSE, the icon. No network: the files are read as those tools read them.
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _requirements() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def test_dependencies_are_static_and_the_same_as_requirements_txt():
    # The Registry reads only static project.dependencies; ComfyUI-Manager installs requirements.txt.
    project = _pyproject()["project"]
    assert "dependencies" not in project.get("dynamic", [])
    assert project["dependencies"] == _requirements()
    assert not any(re.match(r"(vllm|vllm-omni|torch)\b", dep) for dep in project["dependencies"]), \
        "vLLM lives in the server environment, torch comes with ComfyUI"


def test_license_is_a_pep639_expression_with_the_setuptools_floor_that_accepts_it():
    data = _pyproject()
    project = data["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    floor = next(r for r in data["build-system"]["requires"] if r.startswith("setuptools"))
    assert int(re.search(r">=(\d+)", floor)[1]) >= 77       # PEP 639 strings need setuptools 77
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_registry_icon_points_at_a_square_image_in_this_repository():
    comfy = _pyproject()["tool"]["comfy"]
    assert comfy["PublisherId"] and comfy["DisplayName"]
    url = comfy["Icon"]
    assert url.endswith("/main/docs/icon.png")
    with Image.open(REPO / "docs" / "icon.png") as icon:
        assert icon.size[0] == icon.size[1] <= 400         # the Registry's limit
    repository = _pyproject()["project"]["urls"]["Repository"]
    assert url.startswith(repository.replace("https://github.com/", "https://raw.githubusercontent.com/"))
