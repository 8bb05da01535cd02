"""Each template's Note states what 0 (or -1) on Generate video means, its model's request defaults, and
where it states a size step, the model's: the Note's sentence and the family declaration cannot drift
apart (a changed default in models/families.py fails here until the Note is rebuilt)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vllm_omni_launcher.models import family_for

WORKFLOWS = Path(__file__).resolve().parents[2] / "workflows"
DEFAULTS = re.compile(r"recommended value[^:]*: (\d+)x(\d+), (\d+) frames(?: at (\d+) fps| per part)"
                      r"(?:, (\d+) steps)?\.(?: Sizes must be multiples of (\d+))?")


def _with_defaults() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(WORKFLOWS.glob("*.json")):
        api = json.loads((WORKFLOWS / "api" / f"{path.stem}.api.json").read_text())
        models = [n["inputs"]["model"] for n in api.values() if n["class_type"].startswith("VLLMOmniLoad")
                  and isinstance(n["inputs"].get("model"), str)]
        [note] = [n["widgets_values"][0] for n in json.loads(path.read_text())["nodes"] if n["type"] == "Note"]
        if models and "recommended value" in note:
            found.append((path.stem, models[0], note))
    return found


def test_the_templates_with_a_model_state_its_defaults():
    assert len(_with_defaults()) >= 8


@pytest.mark.parametrize("name,model,note", _with_defaults(), ids=[n for n, _, _ in _with_defaults()])
def test_the_note_states_the_models_request_defaults(name, model, note):
    family = family_for(model)
    match = DEFAULTS.search(note)
    assert match, note
    width, height, frames, fps, steps, multiple = match.groups()
    assert (int(width), int(height), int(frames)) == (family.width, family.height, family.frames)
    if fps is not None:
        assert float(fps) == family.fps
    if steps is not None:
        assert int(steps) == family.steps
    if multiple is not None:
        assert int(multiple) == family.size_multiple
