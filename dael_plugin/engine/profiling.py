"""Counting what a training step costs a GPU, on any machine: operator launches and host traffic.

At DAEL's shapes a GPU step is launch-bound (Dassl's DAEL at the miniDomainNet
shape took 52.7 ms on an H200 against a 13.4 ms compute floor), so the number
of operators a step launches is a good proxy for its GPU time, and a CPU can
count it exactly, with no timing noise.

:func:`count_launches` runs a function under ``torch.profiler`` (CPU) and
counts operator launches by this rule:

- an operator that has a CUDA kernel counts as one launch, and what its CPU
  implementation calls inside does not count (the CPU batch norm, for
  example, fills its outputs with ``zero_`` first; a GPU runs one kernel);
- ``_foreach_*`` and ``_fused_*`` operators count as one launch (on a GPU,
  one multi-tensor kernel; on a CPU, a loop inside);
- a composite operator counts the launches of the operators it calls;
- views, metadata and allocation count nothing (:data:`FREE_OPS`): they
  launch no kernel.

It also sums the bytes written by copies (``copy_`` and ``cat``) and counts
host reads (``_local_scalar_dense``: ``.item()``, ``bool()``, ``int()``).

:class:`HostTraffic` watches a step for anything that would make a GPU step
wait for the host or the host for the GPU: a tensor value read on the host
(``.item()``, ``bool()``, ``.tolist()``, ``.numpy()``, ``.cpu()``) or a Python
value turned into a tensor (``torch.tensor(3)``, ``torch.as_tensor(x)``), which
on a GPU is a blocking host-to-device copy. Tensors the caller names as host
data (the loader's CPU batch) may be read.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Counter, Iterable, List, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that launch no kernel: views, metadata and allocation.
FREE_OPS = frozenset(
    f"aten::{n}"
    for n in (
        "view",
        "_unsafe_view",
        "as_strided",
        "as_strided_",
        "reshape",
        "_reshape_alias",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "t",
        "numpy_T",
        "unsqueeze",
        "squeeze",
        "unsqueeze_",
        "squeeze_",
        "select",
        "slice",
        "narrow",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "alias",
        "detach",
        "detach_",
        "lift_fresh",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "resize_",
        "set_",
        "contiguous",
        "to",
        "view_as",
        "result_type",
        "size",
        "stride",
        "dim",
        "is_same_size",
        "resolve_conj",
        "resolve_neg",
        "_has_compatible_shallow_copy_type",
        "flatten",
        "unflatten",
        "type_as",
        "real",
        "_local_scalar_dense_view",
        "is_nonzero",
        "item",
        "_nested_tensor_from_mask",
    )
)
MULTI_TENSOR = ("aten::_foreach", "aten::_fused")
HOST_READ = "aten::_local_scalar_dense"
COPY_OPS = ("aten::copy_", "aten::cat")
_ITEMSIZE = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "bool": 1,
    "unsigned char": 1,
    "signed char": 1,
    "short int": 2,
}


@functools.lru_cache(maxsize=None)
def has_cuda_kernel(name: str) -> bool:
    """Whether an ``aten::`` operator (any overload) has a CUDA kernel in this build of torch."""
    packet = getattr(torch.ops.aten, name.split("::", 1)[1], None)
    if packet is None:
        return False
    for overload in packet.overloads():
        full = name if overload == "default" else f"{name}.{overload}"
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(full, "CUDA"):
                return True
        except RuntimeError:
            continue
    return False


@dataclass
class LaunchCount:
    """Launches per operator, bytes written by copies, and host reads, of one profiled call."""

    ops: Counter = field(default_factory=collections.Counter)
    copy_bytes: int = 0

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def host_reads(self) -> int:
        return self.ops[HOST_READ]

    @property
    def copies(self) -> int:
        return sum(self.ops[n] for n in COPY_OPS)


def _bytes(shapes, dtypes) -> int:
    return sum(_numel(shape) * _ITEMSIZE.get(dtype, 4) for shape, dtype in zip(shapes, dtypes))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# libkineto's own log lines (``USDT:... profiler_start``, and ``ERROR:... gpuGetDeviceCount failed``
# on a machine without a GPU), written to file descriptor 2 by C++ on every profiled region.
_KINETO_LINE = re.compile(r"^(USDT|ERROR|WARNING|INFO):\d{4}-\d\d-\d\d [^\]]*\.cpp:\d+\] ")


@contextlib.contextmanager
def _quiet_kineto():
    """The profiler's C++ log lines kept off the terminal; anything else written meanwhile passes."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 to redirect: nothing to quiet
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(True) if not _KINETO_LINE.match(ln)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def count_launches(fn: Callable[[], object]) -> LaunchCount:
    """Run ``fn()`` once under the CPU profiler and count its operator launches (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_kineto():  # the profiler logs at its start, its stop and while its events are read
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
            fn()
        events = prof.events()
        del prof  # its C++ side logs once more as it goes
    out = LaunchCount()

    def walk(e) -> int:
        children = [c for c in e.cpu_children if c.name.startswith("aten::")]
        if e.name in FREE_OPS:
            return sum(walk(c) for c in children)
        counted = e.name.startswith(MULTI_TENSOR) or has_cuda_kernel(e.name) or not children
        if not counted:
            inner = sum(walk(c) for c in children)
            if inner:
                return inner
        out.ops[e.name] += 1
        if e.name == "aten::copy_":  # (input_dtypes is recorded from torch 2.3 on; fp32 is assumed before)
            out.copy_bytes += _bytes(e.input_shapes[:1], getattr(e, "input_dtypes", None) or ["float"])
        elif e.name == "aten::cat":  # its output, which it allocates (tensor lists' shapes are not recorded)
            out.copy_bytes += max(int(e.self_cpu_memory_usage), 0)
        return 1

    for e in events:
        if e.name.startswith("aten::") and not _has_aten_parent(e):
            walk(e)
    return out


def _has_aten_parent(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("aten::"):
            return True
        p = p.cpu_parent
    return False


_SCALAR_READS = {"item", "__bool__", "__int__", "__float__", "__index__"}  # through aten._local_scalar_dense
_READS = _SCALAR_READS | {"tolist", "numpy", "cpu", "__array__"}
# Operators whose output size depends on the data: on a GPU the host waits for the count.
_SYNCING_OPS = {"nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "masked_scatter"}


class HostTraffic:
    """``with HostTraffic(allow=batch_tensors) as t: step()``; then ``t.events`` lists each host
    read of a tensor and each Python value made a tensor inside the block (module docstring).

    ``allow``: tensors that are host data (the loader's CPU batch), which may be read."""

    def __init__(self, allow: Iterable[torch.Tensor] = ()) -> None:
        self.allowed = {id(t) for t in allow}
        self.events: List[str] = []
        self._allowed_reads = 0  # allowed Python-level reads whose aten read is still to come
        self._modes: Optional[list] = None

    def __enter__(self) -> "HostTraffic":
        outer = self

        class _Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", str(func))
                if name in _READS and args and isinstance(args[0], torch.Tensor):
                    if id(args[0]) in outer.allowed:
                        outer._allowed_reads += name in _SCALAR_READS  # its aten read comes next
                    elif name not in _SCALAR_READS:  # these reach no operator; the others are seen below
                        outer.events.append(f"host read: Tensor.{name} of a {tuple(args[0].shape)} tensor")
                return func(*args, **(kwargs or {}))

        class _Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func.overloadpacket.__name__
                if name == "_local_scalar_dense":
                    if outer._allowed_reads:
                        outer._allowed_reads -= 1
                    else:
                        outer.events.append("host read: aten._local_scalar_dense (item, bool, int or float)")
                elif name == "lift_fresh":
                    outer.events.append("a Python value made a tensor: aten.lift_fresh")
                elif name in _SYNCING_OPS or (name in ("index", "index_put_", "index_put") and _bool_index(args)):
                    outer.events.append(f"data-dependent output size (a GPU sync): aten.{name}")
                return func(*args, **(kwargs or {}))

        self._modes = [_Functions(), _Ops()]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes or []):
            m.__exit__(*exc)
        self._modes = None


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ()))


__all__ = ["FREE_OPS", "HostTraffic", "LaunchCount", "count_launches", "has_cuda_kernel"]
