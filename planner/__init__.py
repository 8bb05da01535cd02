"""GPU memory planning, configuration recommendation and the environment doctor.

Plain Python (no torch, no ComfyUI). Public API:

* ``plan(spec, request=None, gpus=None, ...) -> MemoryPlan``: per-GPU peak as named terms.
* ``recommend(model_or_spec, request=None, gpus=None, ...) -> Recommendation``: fastest fitting config.
* ``step_down(spec, failure_kind, gpus_memory_gb, request_shape=None) -> (LaunchSpec, str) | None``.
* ``run_doctor(model=None, ...) -> DoctorReport``.
"""
from .calibration import CALIBRATION
from .doctor import run_doctor
from .doctor_report import DoctorReport
from .gpus import GpuInfo, hypothetical_gpus, parse_gpu_memory, query_gpus
from .ladder import build_ladder, recommend
from .memory import plan
from .memory_plan import MemoryPlan
from .model_sizes import ModelSizes, model_sizes
from .recommendation import Recommendation
from .request_shape import RequestShape
from .step_down import FAILURE_KINDS, step_down

__all__ = ["CALIBRATION", "DoctorReport", "FAILURE_KINDS", "GpuInfo", "MemoryPlan", "ModelSizes", "Recommendation",
           "RequestShape", "build_ladder", "hypothetical_gpus", "model_sizes", "parse_gpu_memory", "plan",
           "query_gpus", "recommend", "run_doctor", "step_down"]
