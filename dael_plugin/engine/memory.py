"""Memory, before it runs out: a run's cap on host memory (so that running out is one line, not
the kernel's OOM killer), the recognition of the CPU allocator's out-of-memory error, and the
step's activation estimate that refuses, before the first batch, a step that cannot fit."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from dael_plugin.config.keys import available_memory, proc_bytes
from dael_plugin.engine.execution import autocast


def _vm_data() -> Optional[int]:
    """This process's data segment (``VmData``: private writable memory, what RLIMIT_DATA counts)."""
    return proc_bytes("/proc/self/status", "VmData")


def cap_host_memory(local_processes: int = 1, loaders: int = 0) -> Optional[Tuple[int, int]]:
    """On a run without a GPU, lower this process's RLIMIT_DATA to what it holds plus its share of
    the memory available now (Linux). Past it an allocation fails, and torch's allocator error
    becomes the run's one out-of-memory line (exit 4), where otherwise the kernel's OOM killer
    ends the run with SIGKILL and no word (``INPUT.SIZE (1024, 1024)`` on the embedded set's
    configs: 24 GB resident, killed after 70 s on a 23 GB machine). The loader's processes
    inherit the cap. ``loaders``: the bytes its loader processes will hold in shared memory,
    which the cap does not count, so they are left out of it (``config.keys.loader_bytes``). A
    lower limit already set is kept. Returns the previous limits, to restore, or None when
    nothing changed."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    avail, data = available_memory(), _vm_data()
    if avail is None or data is None:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = data + max(avail // max(1, local_processes) - loaders, 0)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        return None
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    return soft, hard


def restore_host_memory(previous: Optional[Tuple[int, int]]) -> None:
    if previous is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, previous)


def is_host_oom(exc: BaseException) -> bool:
    """torch's CPU allocator raises a plain RuntimeError when an allocation fails; a loader process
    that hit it (or that the kernel killed) reaches the main process as a RuntimeError too."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "DefaultCPUAllocator: can't allocate memory" in text
        or "DefaultCPUAllocator: not enough memory" in text
        or "is killed by signal: Killed" in text
    )


def saved_activation_bytes(module: nn.Module, images: torch.Tensor, prec: str = "fp32") -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``module(images)``, each
    storage counted once and the module's parameters not at all, on the module's own device and
    weights, in its current mode and the step's precision. The module's buffers (batch-norm
    running statistics) are left untouched: the pass reads copies of them."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = max(kept.get(s.data_ptr(), 0), s.nbytes())
        return t

    buffers = {n: b.clone() for n, b in module.named_buffers()}
    with (
        torch.enable_grad(),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        autocast(prec, images.device),
    ):
        out = torch.func.functional_call(module, buffers, (images,), strict=False)
    del out
    return sum(kept.values())


def check_step_memory(
    model: nn.Module,
    device: torch.device,
    size: Sequence[int],
    images_with_grad: int,
    prec: str,
    what: str,
    available: Optional[int] = None,
    local_processes: int = 1,
) -> Optional[int]:
    """Refuse, in one line, a step whose activations alone cannot fit in the memory available now
    (``model``: the backbone and the heads, as one module).

    A step keeps, for its backward pass, what autograd saves for each image that passes the
    backbone with gradients (``images_with_grad``: the source views and the target's prediction
    view). That is measured on two and on four images of ``size`` (:func:`saved_activation_bytes`):
    the difference is what each image adds, the rest is kept once per pass (autocast's weight
    copies, batch norm's batch statistics);
    parameters, gradients, optimiser state and workspace come on top, so the figure is a floor and
    a refusal is never a false alarm. Without it a batch of 65535 on a 360-image set filled 22 GB
    of host memory over 109 s before the allocator's error. Available: the GPU's free memory, or on
    the CPU this process's share of ``MemAvailable``. Returns the estimate in bytes (None when it
    could not be measured: a backbone that cannot run two images alone is left to the step)."""
    from dael_plugin.errors import DAELConfigError

    modes = [(m, m.training) for m in model.modules()]
    model.train()
    # The probe draws its images and any dropout from forked streams: the run's random state is
    # the same with the check as without it.
    cuda = [device.index or 0] if device.type == "cuda" and torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            probe = torch.randn(4, 3, int(size[0]), int(size[1]), device=device)
            # (a copy: a slice would share, and count, the four images' storage)
            two, four = (saved_activation_bytes(model, probe[:n].clone(), prec) for n in (2, 4))
            del probe
        # What grows with the batch, and what does not: under autocast the low-precision copies of
        # the weights are kept once per pass (11.4M parameters of ResNet-18: 22 MiB in bf16), and
        # counting them per image put a bf16 ResNet-18 step at 3.3x what the H200's allocator held.
        per_image = max(four - two, 0) / 2
        fixed = max(two - 2 * per_image, 0)
    except torch.cuda.OutOfMemoryError:
        per_image = fixed = math.inf
    except RuntimeError as e:
        if not is_host_oom(e):
            return None  # the step itself will say what is wrong
        per_image = fixed = math.inf
    finally:
        for m, training in modes:
            m.training = training
    need = fixed + per_image * images_with_grad
    if available is None:
        if device.type == "cuda":
            # The driver's free memory, plus what PyTorch's caching allocator holds unused (the
            # driver counts that as taken, but the step's tensors will reuse it).
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            available = torch.cuda.mem_get_info(device)[0] + cached
        else:
            from dael_plugin.config.keys import available_memory

            avail = available_memory()
            available = None if avail is None else avail // max(1, local_processes)
    if available is not None and need > available:
        each = (
            "over the memory available for four images"
            if math.isinf(per_image)
            else f"{per_image / 2**20:.2f} MiB each"
        )
        raise DAELConfigError(
            f"a training step keeps at least {need / 2**30:.1f} GiB of activations for its backward pass "
            f"({what}: {images_with_grad} images with gradients, {each} at INPUT.SIZE "
            f"({int(size[0])}, {int(size[1])}), {prec}), and this {'GPU' if device.type == 'cuda' else device.type.upper()} has "
            f"{available / 2**30:.1f} GiB available; lower the batch sizes or INPUT.SIZE"
        )
    return None if math.isinf(need) else int(need)
