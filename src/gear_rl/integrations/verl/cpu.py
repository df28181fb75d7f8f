"""verl on a CPU: a ``cpu`` platform for verl 0.9.1's ``PlatformRegistry``, selected by verl's own
``VERL_PLATFORM=cpu``.

verl 0.9.1 registers platforms for NVIDIA, AMD and Huawei accelerators only and falls back to
``nvidia`` when none is found (``verl/plugin/platform/platform_manager.py``,
``_detect_platform_name``), so on a machine without a GPU its workers ask for NCCL and fail
(``verl/utils/distributed.py:93``; verl's issue #3266). This module answers that without editing
verl: gear-rl's ``verl.plugins`` entry point registers :class:`PlatformCPU` under the name ``cpu``,
which verl picks only when ``VERL_PLATFORM=cpu`` is set (its auto-detection probes
``is_platform_available``, which is ``False`` here, so a machine with an accelerator never picks
it). ``scripts/verl_cpu.sh`` sets it, with the rest of what a CPU job needs
(:data:`CPU_ENV`, :func:`cpu_overrides`); docs/verl.md, "verl on a CPU", lists each workaround.

What the platform answers, each against verl 0.9.1:

- device ``cpu`` with ``torch.device("cpu")`` as its current device: FSDP2 loads the full state
  dict onto ``get_device_id()`` (``verl/utils/fsdp_utils.py:507``) and needs a real device there;
- backend ``gloo``; verl builds ``f"cpu:gloo,{device}:{backend}"``
  (``verl/utils/distributed.py:89``), which reads ``cpu:gloo,cpu:gloo`` here and which torch
  refuses ("Duplicate device type cpu"): :func:`_collapse_duplicate_backends` turns a backend
  string whose pairs all repeat one ``device:backend`` into that one pair, and leaves every other
  string alone. It wraps ``torch.distributed.init_process_group`` in the process that
  instantiates this platform, that is only where ``VERL_PLATFORM=cpu`` selected it;
- Ray resource ``GPU``: verl's resource pools count GPUs (``single_controller/ray/base.py``,
  ``ResourcePoolManager._check_resource_available``), so a CPU job declares logical ones with
  ``+ray_kwargs.ray_init.num_gpus=N`` (in :func:`cpu_overrides`); Ray sets no device variable for
  them that torch would read on a CPU.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import resource
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from gear_rl.integrations.cpu_mode import PLATFORM_ENV, PLATFORM_NAME, cpu_mode_requested

logger = logging.getLogger(__name__)


CPU_ENV: dict[str, str] = {
    # verl's platform switch: selects PlatformCPU (registered by gear-rl's verl.plugins entry).
    PLATFORM_ENV: PLATFORM_NAME,
    # verl's engine registry holds the FSDP engine for cuda/npu only
    # (verl/workers/engine/fsdp/transformer_impl.py:1143); verl's own override picks it.
    "VERL_ENGINE_DEVICE": "cuda",
}
"""The environment a verl job needs on a CPU, every variable verl's or vLLM's own switch."""


PRECISIONS = ("fp32", "bf16")


def cpu_overrides(*, n_ranks: int = 1, precision: str = "fp32") -> list[str]:
    """The Hydra overrides a verl 0.9.1 job needs on a CPU with ``n_ranks`` FSDP ranks, each named
    with the verl or vLLM behaviour it answers (docs/verl.md, "verl on a CPU"). Keys outside
    verl's schema use ``++`` (add or override), so a later override of the same key wins."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    # verl computes the actor in bf16 (FSDP mixed precision) and vLLM samples in bf16 by
    # default. fp32 (the default here) runs on every CPU (bf16 is emulated, several times
    # slower, without AVX-512 BF16 / AMX) and keeps vLLM's and the actor's probabilities of
    # the same tokens within 1e-4 even for peaked policies; in bf16 they were 0.1 apart on the
    # tir smoke model (an AMX Xeon).
    dtypes = [] if precision == "bf16" else [
        "actor_rollout_ref.rollout.dtype=float32",
        "++actor_rollout_ref.actor.fsdp_config.mixed_precision="
        "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    ]
    return [*dtypes,
        # TransferQueue's controller and its storage units each take a Ray CPU: with the real
        # 2 cores the job waits for them forever. Ray CPUs are logical; 16 is enough.
        "ray_kwargs.ray_init.num_cpus=16",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
        # verl's resource pool counts Ray GPUs (single_controller/ray/base.py): logical ones.
        f"++ray_kwargs.ray_init.num_gpus={n_ranks}",
        f"trainer.n_gpus_per_node={n_ranks}",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        # FlashAttention2 is verl's default (workers/config/model.py:185).
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        # FSDP1 always asks for an accelerator (workers/engine/fsdp/transformer_impl.py:437).
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        # Memory on a 2-core, 24 GB machine: verl starts 8 agent-loop workers and 8 data-loader
        # processes by default, each importing torch and verl (0.5-1 GB apiece).
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "data.dataloader_num_workers=0",
        # vLLM-CPU has no sleep mode.
        "++actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
    ]


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` with what verl asks of a device module and ``torch.cpu`` lacks. Memory
    queries report this process's resident set (current and peak), so verl's
    ``perf/max_memory_allocated_gb`` reads as the worker's peak RSS on a CPU."""

    def __init__(self) -> None:
        super().__init__("gear_rl_verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"  # what verl's flops counter reads for torch.cpu (no promised FLOPS)

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    memory_reserved = memory_allocated

    @classmethod
    def max_memory_allocated(cls, device: Any = None) -> int:
        # the kernel's peak (KiB), at least what statm counts now (it rounds differently)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(peak, cls.memory_allocated())

    max_memory_reserved = max_memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


CPU_DEVICE_MODULE = _CPUDeviceModule()


def _collapse_duplicate_backends(backend: Any) -> Any:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``; any other value unchanged."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    pairs = {pair.strip().lower() for pair in backend.split(",")}
    return pairs.pop() if len(pairs) == 1 else backend


def _install_backend_fix() -> None:
    """Wrap ``torch.distributed.init_process_group`` once in this process (see module doc)."""
    init = torch.distributed.init_process_group
    if getattr(init, "_gear_rl_cpu", False):
        return

    @functools.wraps(init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            args = (_collapse_duplicate_backends(args[0]), *args[1:])
        elif "backend" in kwargs:
            kwargs["backend"] = _collapse_duplicate_backends(kwargs["backend"])
        return init(*args, **kwargs)

    init_process_group._gear_rl_cpu = True  # type: ignore[attr-defined]
    torch.distributed.init_process_group = init_process_group


def platform_class() -> type:
    """The ``PlatformBase`` subclass (built on first call: importing verl's platform package
    imports verl's CUDA and NPU platforms)."""
    global _PLATFORM_CLASS
    if _PLATFORM_CLASS is not None:
        return _PLATFORM_CLASS
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl's platform interface on the host CPU (gear-rl; ``VERL_PLATFORM=cpu``)."""

        def __init__(self) -> None:
            _install_backend_fix()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> ModuleType:
            return CPU_DEVICE_MODULE

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # Never auto-detected: only VERL_PLATFORM=cpu selects it.
            return False

        def current_device(self) -> Any:
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: Any) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray sets CUDA_VISIBLE_DEVICES for its logical GPUs; nothing on a CPU reads it.
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
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

        def cudart(self) -> Any:
            return None

    _PLATFORM_CLASS = PlatformCPU
    return PlatformCPU


_PLATFORM_CLASS: type | None = None


def register_platform() -> bool:
    """Register :class:`PlatformCPU` with verl's ``PlatformRegistry`` under ``cpu`` when
    ``VERL_PLATFORM=cpu`` asks for it. Returns whether it registered; idempotent."""
    if not cpu_mode_requested():
        return False
    from verl.plugin.platform import PlatformRegistry

    cls = platform_class()
    if PlatformRegistry.get(PLATFORM_NAME) is not cls:
        PlatformRegistry.register(platform=PLATFORM_NAME)(cls)
    return True
