"""GPU memory planning, configuration recommendation and the environment doctor.

Plain Python (no torch, no ComfyUI). Public API:

* ``plan(spec, request=None, gpus=None, ...) -> MemoryPlan``: per-GPU peak as named terms.
* ``recommend(model_or_spec, request=None, gpus=None, ...) -> Recommendation``: fastest fitting config.
* ``run_doctor(model=None, ...) -> DoctorReport``.

A function named like its own module (``model_sizes.model_sizes``, ``step_down.step_down``) is not
re-exported: the package attribute would then be the function, hiding the module
(``planner.model_sizes`` must stay the module); import those from their modules.
"""
from .calibration import CALIBRATION
from .doctor import run_doctor
from .doctor_report import DoctorReport
from .gpus import GpuInfo, hypothetical_gpus, parse_gpu_memory, query_gpus
from .ladder import build_ladder, recommend
from .memory import plan
from .memory_plan import MemoryPlan
from .model_sizes import ModelSizes
from .recommendation import Recommendation
from .request_shape import RequestShape
from .step_down import FAILURE_KINDS

__all__ = ["CALIBRATION", "DoctorReport", "FAILURE_KINDS", "GpuInfo", "MemoryPlan", "ModelSizes", "Recommendation",
           "RequestShape", "build_ladder", "hypothetical_gpus", "parse_gpu_memory", "plan", "query_gpus",
           "recommend", "run_doctor"]
