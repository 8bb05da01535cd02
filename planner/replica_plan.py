"""Replicas in the planner: one memory plan per replica, `auto` for N copies, and when to suggest them.

A server with `replicas` N runs N copies of one parallel layout, each on its own GPUs
(server/launch/replicas.py). Memory is per copy: every replica must fit the GPUs it gets, so the
plan is made per replica, on that replica's GPUs (a mixed machine can fit one copy and not
the other). With `auto`, the planner picks the layout for one copy on gpus / N GPUs (the
tightest share) and the copies are laid side by side; the user's N is never changed.

When to suggest replicas: a parallel mode makes one video faster, replicas make more
videos at once. On two H200s a parallel mode is close to 2x per denoise step (Ulysses 2
1.91x, CFG 2 1.98x: speed_costs.py), but what does not split (text encoding, the decode
without VAE patch parallel) and the traffic between the GPUs stay, and CFG parallel idles a
GPU at guidance 1; two replicas run two whole jobs side by side with no traffic at all. So
when several jobs are queued and the model fits one card, replicas finish the queue at least
as soon, and sooner on GPUs without a fast link. The planner says so in its text; it does
not switch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

from ..errors import LauncherError, SpecError
from ..server.launch.flags import Version
from ..server.launch.spec import LaunchSpec
from .gpus import GpuInfo, hypothetical_gpus, query_gpus
from .ladder import GpuArg, recommend
from .memory import plan
from .memory_plan import MemoryPlan
from .recommendation import Recommendation
from .request_shape import RequestShape


def groups(ids: Sequence[int], replicas: int, per_replica: int) -> list[tuple[int, ...]]:
    """The GPUs of each replica, in upstream's order: replica r gets ids[r*M : r*M+M]."""
    return [tuple(ids[r * per_replica:(r + 1) * per_replica]) for r in range(replicas)]


def gpu_pool(visible: Sequence[int], sizes: Sequence[float], hypothetical: bool) -> Optional[list[GpuInfo]]:
    """GPUs to plan on with their real ids: None asks NVML (real cards); sizes from the
    environment become cards of those sizes under the visible ids."""
    if not hypothetical:
        return None
    return [replace(g, index=i) for g, i in zip(hypothetical_gpus(list(sizes)), visible)]


@dataclass(frozen=True)
class ReplicaPlan:
    """One memory plan per replica."""

    spec: LaunchSpec
    plans: list[MemoryPlan]


def plan_replicas(spec: LaunchSpec, ids: Sequence[int], request: Optional[RequestShape] = None,
                  pool: Optional[list[GpuInfo]] = None, server_version: Optional[Version] = None) -> ReplicaPlan:
    """The memory plan of each replica of `spec` on its share of `ids` (the server's GPUs)."""
    world = spec.parallel.world_size
    one = replace(spec, replicas=1)
    plans = [plan(replace(one, gpus=grp), request, pool, server_version=server_version)
             for grp in groups(ids, spec.replicas, world)]
    return ReplicaPlan(spec, plans)


def recommend_for(base: LaunchSpec, request: Optional[RequestShape] = None, gpus: GpuArg = None,
                  **kw: Any) -> Recommendation:
    """`recommend` (ladder.py) for `base.replicas` copies: the fastest layout that fits the tightest
    share of the GPUs (gpus / replicas cards each), laid out once per replica. One replica:
    `recommend` itself. The user's replica count is kept; too few GPUs for it is an error."""
    n = base.replicas
    if n <= 1:
        return recommend(base, request, gpus, **kw)
    cards = _cards(base, gpus)
    share = len(cards) // n
    if share < 1:
        raise SpecError(f"{n} replicas need at least {n} GPUs", f"{len(cards)} GPU(s) are selected",
                        f"set replicas to {max(1, len(cards))} or fewer, or select more GPUs", setting="replicas")
    shares = [cards[r * share:(r + 1) * share] for r in range(n)]
    tight = min(shares, key=lambda grp: min(g.available_gib for g in grp))
    ids = tuple(g.index for g in tight)
    rec = recommend(replace(base, replicas=1, gpus=ids), request, tight, **kw)
    if rec.spec is None:
        return replace(rec, reason=f"for one of {n} replicas on {share} GPU(s): {rec.reason}")
    world = rec.spec.parallel.world_size
    used = tuple(g.index for grp in shares for g in grp[:world])
    return replace(rec, spec=replace(rec.spec, replicas=n, gpus=used),
                       label=f"{n} replicas x ({rec.label})",
                       reason=f"{rec.reason}; planned for one replica on the tightest share, GPU(s) "
                              f"{','.join(map(str, ids))}, and laid out {n} times")


def _cards(base: LaunchSpec, gpus: GpuArg) -> list[GpuInfo]:
    """The GPUs the replicas share, under the ids the spec uses (sizes become cards 0..n-1, or the
    spec's ids when it names as many)."""
    if gpus is None:
        found, reason = query_gpus()
        if not found:
            raise LauncherError("Cannot plan replicas without knowing the GPUs", reason or "NVML found no GPU",
                                "give the GPU sizes, e.g. --gpu-memory 24,24 (CLI)", setting="gpu_memory")
        return [g for g in found if base.gpus is None or g.index in base.gpus]
    cards = hypothetical_gpus([float(x) for x in gpus]) if isinstance(gpus[0], (int, float)) else list(gpus)
    if base.gpus is not None and len(base.gpus) == len(cards) and all(g.hypothetical for g in cards):
        cards = [replace(g, index=i) for g, i in zip(cards, base.gpus)]
    return cards


def per_replica(failed: LaunchSpec, ids: Sequence[int],
                step: Callable[[LaunchSpec, tuple[int, ...]], Optional[tuple[LaunchSpec, str]]]
                ) -> Optional[tuple[LaunchSpec, str]]:
    """An OOM step-down for a replicated server: `step` proposes the leaner layout for one replica
    on its GPUs, and every replica gets it. A step that needs more GPUs per replica than each
    has is no step (it would take another replica's GPUs)."""
    world = failed.parallel.world_size
    shares = groups(ids, failed.replicas, world)
    proposed = step(replace(failed, replicas=1, gpus=shares[0]), shares[0])
    if proposed is None or proposed[0].parallel.world_size > world:
        return None
    new_world = proposed[0].parallel.world_size
    used = tuple(g for grp in shares for g in grp[:new_world])
    return replace(proposed[0], replicas=failed.replicas, gpus=used), f"{proposed[1]} (each of the {failed.replicas} replicas)"


def replica_advice(spec: LaunchSpec, gpu_count: int, queued_jobs: int, one_gpu_fits: Optional[bool]) -> str:
    """A sentence suggesting replicas ('' when they would not help): several jobs queued, several
    GPUs, one replica on one card fits, and the server is not replicated yet."""
    if spec.replicas > 1 or queued_jobs < 2 or gpu_count < 2 or not one_gpu_fits:
        return ""
    n = min(gpu_count, queued_jobs)
    return (f"{queued_jobs} jobs are queued and the model fits one GPU: replicas {n} (one copy per GPU, "
            f"{n} whole jobs at once, no traffic between the GPUs) finishes them at least as soon as one job "
            f"at a time split over {spec.gpu_count} GPU(s), and sooner without a fast GPU link; set replicas "
            f"to {n} on Serving Config (CLI --replicas {n}) to use it")


def one_gpu_fits(base: LaunchSpec, gpu_id: int, pool: Optional[list[GpuInfo]],
                 request: Optional[RequestShape] = None, server_version: Optional[Version] = None) -> Optional[bool]:
    """Whether one replica on one card fits without a parallel mode (as `recommend` plans it)."""
    one = replace(base, replicas=1, gpus=(gpu_id,), parallel=replace(base.parallel, mode="none", degree=1,
                                                                       vae_patch=1, hsdp=False))
    return plan(one, request, pool, server_version=server_version).fits
