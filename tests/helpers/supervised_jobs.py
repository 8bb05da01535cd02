"""Jobs sent straight to a supervised stub server over HTTP (not through the launcher's client), so
a supervision test controls exactly what the server gets and sees its own answers."""
from __future__ import annotations

from typing import Any

import requests

from stubserver import wait_for
from vllm_omni_launcher.server.supervision.supervisor import Supervisor


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False           # no proxy between us and 127.0.0.1
    return s


def auth(sup: Supervisor) -> dict[str, str]:
    return {"Authorization": f"Bearer {sup.api_key}"} if sup.api_key else {}


def submit(sup: Supervisor, steps: int = 4, seed: int = 1) -> str:
    """POST a small job (256x128, 9 frames) and tell the supervisor a job is active; its id."""
    fields = {"prompt": "a red fox in snow", "width": "256", "height": "128", "num_frames": "9", "fps": "16",
              "num_inference_steps": str(steps), "seed": str(seed)}
    r = session().post(f"{sup.url}/v1/videos", files={k: (None, v) for k, v in fields.items()},
                       headers=auth(sup), timeout=60)
    assert r.status_code == 200, r.text
    sup.mark_job_activity()
    return r.json()["id"]


def job_state(sup: Supervisor, job_id: str) -> dict[str, Any]:
    r = session().get(f"{sup.url}/v1/videos/{job_id}", headers=auth(sup), timeout=30)
    return r.json()


def wait_job(sup: Supervisor, job_id: str, timeout: float = 120) -> dict[str, Any]:
    """The job's state once it is completed or failed (bounded poll)."""
    return wait_for(lambda: (lambda b: b if b.get("status") in ("completed", "failed") else None)(
        job_state(sup, job_id)), timeout, f"job {job_id} to finish", interval=0.2)
