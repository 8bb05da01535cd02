"""The last Local Server's choices, as `prestart_last_server` stores and reads them.

The core stores plain JSON (server/storage/last_server.py); this module turns the nodes' choice types
into it (`record`, called by session.start_local once a server is ready) and back (`choices`), checking
every recorded value as the Serving Config and LoRA nodes would (types, options, min and max) and that
the model folder and LoRA files still exist. Apart from prestart.py so that session.py can record without
importing the prestart, which imports session.py's launch.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, get_args

from ..errors import LauncherError
from ..models import ALL_FAMILIES
from ..server.config.local_config import LocalConfig
from ..server.config.settings import settings_of
from ..server.launch.loras import MAX_STRENGTH, Expert, LoraEntry
from ..server.storage import last_server
from .handles import ModelChoice, ServingChoice
from .schema import check_inputs, setting_inputs

LOG = logging.getLogger("vllm_omni_launcher")
PREFIX = f"vLLM-Omni Launcher: {last_server.SETTING}:"
_LORA_FIELDS = {"path": str, "strength": float, "expert": str, "label": str}


def record(model: ModelChoice, serving: ServingChoice, cfg: bool, queued_jobs: int, fingerprint: str,
           config: LocalConfig) -> None:
    """Remember the choices of a ready Local Server (best effort: a data dir that cannot take the
    file must not fail the node that already has its server)."""
    entry = {"model": {"model": model.model, "family_key": model.family_key, "label": model.label,
                       "loras": [dataclasses.asdict(lora) for lora in model.loras]},
             "serving": dataclasses.asdict(serving), "cfg": cfg, "queued_jobs": queued_jobs,
             "fingerprint": fingerprint}
    try:
        last_server.write(config.data_dir, entry)
    except (OSError, ValueError, LauncherError) as exc:
        LOG.warning("%s could not record the last Local Server: %s", PREFIX, exc)


def choices(entry: dict[str, Any]) -> tuple[ModelChoice, ServingChoice]:
    """The recorded choices as the nodes' types; BadRecord names what is wrong."""
    model = entry["model"]
    family = model.get("family_key")
    if family not in ALL_FAMILIES:
        raise last_server.BadRecord(f"its model family {family!r} is not one this launcher knows")
    path = model.get("model")
    if not isinstance(path, str) or not path:
        raise last_server.BadRecord("its model is not a name or folder")
    if Path(path).is_absolute() and not Path(path).is_dir():
        raise last_server.BadRecord(f"its model folder {path} no longer exists")
    loras = model.get("loras")
    if not isinstance(loras, list):
        raise last_server.BadRecord("its LoRA list is not a list")
    entries = tuple(_lora(item) for item in loras)
    label = model.get("label", "")
    if not isinstance(label, str):
        raise last_server.BadRecord("its model label is not text")
    return ModelChoice(path, family, label, entries), _serving(entry["serving"])


def _lora(item: Any) -> LoraEntry:
    if not isinstance(item, dict) or set(item) != set(_LORA_FIELDS):
        raise last_server.BadRecord("a LoRA entry does not have the fields path, strength, expert and label")
    for key, kind in _LORA_FIELDS.items():
        value = item[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue
        if not isinstance(value, kind):
            raise last_server.BadRecord(f"a LoRA's {key} is not a {kind.__name__}")
    if not 0 <= item["strength"] <= MAX_STRENGTH:
        raise last_server.BadRecord(f"a LoRA's strength {item['strength']} is outside 0..{MAX_STRENGTH:g}")
    if item["expert"] not in get_args(Expert):
        raise last_server.BadRecord(f"a LoRA's expert {item['expert']!r} is not one of {', '.join(get_args(Expert))}")
    if not Path(item["path"]).is_file():
        raise last_server.BadRecord(f"its LoRA file {item['path']} no longer exists")
    return LoraEntry(item["path"], float(item["strength"]), item["expert"], item["label"])


def _serving(values: dict[str, Any]) -> ServingChoice:
    """Serving Config's widgets, checked as the node checks a workflow's (schema.check_inputs)."""
    return ServingChoice(**check_inputs("Serving Config", setting_inputs(settings_of(ServingChoice)), values))
