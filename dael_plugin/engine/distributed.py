"""One run on several processes: torchrun's environment, the process group, and the few
collectives the engines need. Off torchrun (no ``WORLD_SIZE`` > 1) every function here is a
no-op and a run is exactly a single-process run.

- Launch with ``torchrun --nproc_per_node N scripts/train.py ...``: NCCL on CUDA (one GPU per
  process, from ``LOCAL_RANK``), gloo on CPU. Collectives time out after
  ``DAEL_DIST_TIMEOUT`` seconds (default 300), so a rank that hangs stops the others
  with an error instead of a silent wait; a rank that dies is seen by torchrun, which stops the rest.
- The configured batch is the global batch: each process takes ``1/N`` of every domain chunk
  and of the target batch (:meth:`dael_plugin.data.sampling.Shard`), and batch norm is
  synchronised per domain chunk (:func:`dael_plugin.core.chunk_norm.set_sync`).
- DDP averages the gradients over the processes. Every loss term is a mean over a fixed number
  of samples, and every process holds the same number of each chunk's samples, so the mean of
  the processes' local losses is the single-process loss; synchronised batch norm makes each
  local gradient the single-process gradient of that shard times N, and DDP's average divides
  by N again: the averaged gradient is the single-process gradient.
- Rank 0 alone writes (checkpoints, ``results.json``, logs, TensorBoard, the run lock); the other
  ranks print nothing on stdout.
- Two groups, as detectron2's ``comm`` keeps them: :func:`device_group` for the training device's
  tensors (batch-norm statistics, DDP's gradients) and :func:`host_group`, a gloo group, for host
  values (flags, pickled objects, barriers). NCCL serves CUDA tensors only, so a host flag
  all-reduced in NCCL's group fails at the first log line of every multi-GPU run. With
  ``DAEL_DIST_BACKEND=cuda:gloo`` (the tests) the default group refuses CPU tensors as NCCL's does,
  so a CPU run catches any collective that strays into it.
- A torchrun launch is a process group at any size: ``--nproc_per_node 1`` runs NCCL, DDP and the
  synchronised batch norm on one GPU (``scripts/gpu_bench.sh`` relies on it).
"""

from __future__ import annotations

import datetime
import io
import os
import re
import signal
import sys
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from dael_plugin.errors import DAELConfigError

TIMEOUT_ENV = "DAEL_DIST_TIMEOUT"
BACKEND_ENV = "DAEL_DIST_BACKEND"  # the default group's backend; tests set "cuda:gloo" (NCCL's refusals on CPU)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    launched: bool = False  # by torchrun (then a process group, even of one process)

    @property
    def distributed(self) -> bool:
        return self.size > 1 or self.launched

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_WORLD = World()


def world() -> World:
    """This process's place in the run (``World()`` off torchrun)."""
    return _WORLD


def from_env() -> World:
    """torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; a torchrun launch (``TORCHELASTIC_RUN_ID``)
    is distributed at any size."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    launched = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
    if size <= 1 and not launched:
        return World()
    return World(int(os.environ.get("RANK", "0")), max(size, 1), int(os.environ.get("LOCAL_RANK", "0")), launched)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_launcher() -> bool:
    """Ask Linux to send this worker SIGTERM when its torchrun dies (``PR_SET_PDEATHSIG``).

    torchrun starts each worker in a session of its own, so ``kill -9`` of torchrun, or of its
    process group, leaves the workers training with nobody to reap them. With this, the kernel
    stops them as a scheduler's SIGTERM does (each saves nothing more than its last epoch's
    checkpoint and exits). Returns whether it was set (Linux only; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # torchrun died before the request: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)
    return True


# gloo's messages (its RuntimeErrors name their source file under .../gloo/...); NCCL's are DistErrors
_LOST_PEER = ("connection closed by peer", "connection reset by peer", "timed out waiting", "/gloo/")


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because another process of the job died or
    stalled (gloo's ``Connection closed by peer`` or ``Timed out``, NCCL's errors), under torchrun."""
    if not world().distributed:
        return False
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(p in str(exc).lower() for p in _LOST_PEER)


def lost_peer_line(exc: BaseException) -> str:
    """The one line a surviving rank prints for :func:`lost_peer`."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # gloo's "[../gloo/transport/tcp/pair.cc:534]" prefix
    if len(first) > 160:  # cut at a word, never inside one
        first = first[:160].rsplit(" ", 1)[0] + " ..."
    timeout = os.environ.get(TIMEOUT_ENV, "300")
    return (
        f"rank {world().rank} lost contact with another process of this torchrun job ({first}): a rank died, "
        f"or stalled past {TIMEOUT_ENV}={timeout} s; torchrun's report below names the rank that failed. "
        "Rerun the same command to resume from the last checkpoint"
    )


def init(use_cuda: bool) -> World:
    """Join the process group of a torchrun launch (once); returns this process's place."""
    global _WORLD
    w = from_env()
    if not w.distributed or dist.is_initialized():
        _WORLD = w
        return w
    if w.launched:
        die_with_launcher()
    cuda = use_cuda and torch.cuda.is_available()
    if cuda:
        if torch.cuda.device_count() <= w.local_rank:
            raise DAELConfigError(
                f"LOCAL_RANK {w.local_rank} has no GPU (this machine has "
                f"{torch.cuda.device_count()}); lower --nproc_per_node"
            )
        torch.cuda.set_device(w.local_rank)
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300")))
    dist.init_process_group(os.environ.get(BACKEND_ENV) or ("nccl" if cuda else "gloo"), timeout=timeout)
    _WORLD = w
    _make_groups("cuda" if cuda else "cpu", timeout)
    quiet_unless_main()
    return w


_GROUPS: dict = {}


def serves(group: Any, device_type: str) -> bool:
    """Whether ``group`` has a backend for tensors on ``device_type`` (NCCL's: cuda only)."""
    config = str(dist.get_backend_config(group))
    return any(part.split(":")[0] == device_type for part in config.split(",")) if ":" in config else True


def _make_groups(device_type: str, timeout: datetime.timedelta) -> None:
    """The device group (the default one where it serves the training device) and a gloo group
    for host values (the default one where it serves the CPU). Every rank makes them in one order."""
    world_group = dist.group.WORLD
    host = world_group if serves(world_group, "cpu") else dist.new_group(backend="gloo", timeout=timeout)
    if serves(world_group, device_type):
        device_ = world_group
    else:  # only under the tests' cuda:gloo stand-in with a CPU training device
        device_ = host if host is not world_group else dist.new_group(backend="gloo", timeout=timeout)
    _GROUPS.update(host=host, device=device_)


def host_group() -> Any:
    """The group for host values (flags, objects, barriers): gloo, whatever serves the device."""
    return _GROUPS.get("host", dist.group.WORLD)


def device_group() -> Any:
    """The group for the training device's tensors (batch-norm statistics, DDP's gradients)."""
    return _GROUPS.get("device", dist.group.WORLD)


class _Discard(io.TextIOBase):
    """A stdout that keeps nothing (the ranks other than 0 under torchrun)."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)


_SPEAKING: Optional[Any] = None  # the stdout a quiet rank replaced, which finish() puts back


def quiet_unless_main() -> None:
    """Under torchrun, ranks other than 0 print nothing on stdout (errors still go to stderr).

    The run's lines, the plugin's and Dassl's alike, are ``print`` calls on ``sys.stdout`` (Dassl's
    ``setup_logger`` and the built-in engine's log both tee ``sys.stdout`` into the run's log file),
    so a ``logging`` filter would not reach Dassl's lines. Such a rank's ``sys.stdout`` is swapped
    for a stream that discards, the way those loggers swap it, and :func:`finish` puts the real one
    back; ``builtins.print`` is left alone."""
    global _SPEAKING
    if _SPEAKING is not None or from_env().rank == 0:
        return
    _SPEAKING = sys.stdout
    sys.stdout = _Discard()


def device(use_cuda: bool) -> torch.device:
    """This process's training device: its ``LOCAL_RANK``'s GPU under torchrun."""
    if use_cuda and torch.cuda.is_available():
        return torch.device("cuda", _WORLD.local_rank) if _WORLD.distributed else torch.device("cuda")
    return torch.device("cpu")


def seed_ranks(seed: int) -> None:
    """After the model is built (and DDP has given every process rank 0's weights): each rank
    other than 0 gets streams of its own for what it draws on the device (``AUG_ON_DEVICE``'s
    views, dropout), so that the processes' shards are not augmented alike. Rank 0 keeps the
    single-process stream; a resumed run restores every rank's own streams."""
    if _WORLD.distributed and _WORLD.rank > 0:
        torch.manual_seed((max(int(seed), 0) * 1_000_003 + _WORLD.rank) % (2**63))


def finish() -> None:
    global _SPEAKING
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _GROUPS.clear()
    if _SPEAKING is not None:  # a quiet rank speaks again (an in-process caller's next run)
        sys.stdout, _SPEAKING = _SPEAKING, None


def any_true(flag: bool) -> bool:
    """Whether ``flag`` holds on any process (a host value: read where the host reads anyway)."""
    if not _WORLD.distributed:
        return bool(flag)
    t = torch.tensor([1.0 if flag else 0.0])  # a host value: the host group (gloo), never NCCL's
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=host_group())
    return bool(t.item() > 0)


def mean_over_processes(t: torch.Tensor) -> torch.Tensor:
    """The mean of a device tensor over the processes (a copy; the input is unchanged)."""
    if not _WORLD.distributed:
        return t
    out = t.detach().clone()
    dist.all_reduce(out, group=device_group())
    return out / _WORLD.size


def gather_objects(obj: Any) -> List[Any]:
    """Every process's ``obj``, in rank order (``[obj]`` off torchrun)."""
    if not _WORLD.distributed:
        return [obj]
    out: List[Optional[Any]] = [None] * _WORLD.size
    dist.all_gather_object(out, obj, group=host_group())
    return out


# Keys that may differ between the nodes of one job: where each node mounts the data and the output
# folder (the data's own fingerprint is compared instead, over paths relative to the root).
NODE_LOCAL_KEYS = ("DATASET.ROOT", "OUTPUT_DIR")


def _flat(node: Any, prefix: str = "") -> dict:
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif key not in NODE_LOCAL_KEYS:
            out[key] = v
    return out


def check_same_run(cfg: Any, fingerprint: Optional[dict]) -> None:
    """Every process of a torchrun job runs one run: each compares its settings (every config key
    but :data:`NODE_LOCAL_KEYS`, the seed among them) and its data fingerprint with rank 0's, over
    the host group. Two ``--nnodes 2`` launches with another ``OPTIM.LR``, ``--seed`` or ``--root``
    (one image fewer) trained to the end with rank 0's settings in ``results.json``; now every rank
    stops in the same line, naming the rank and the first differing key."""
    if not _WORLD.distributed:
        return
    from dael_plugin.errors import DAELConfigError

    mine = {"config": _flat(cfg), "data": fingerprint or {}}
    every = gather_objects(mine)
    ref = every[0]
    for rank, other in enumerate(every[1:], 1):
        for key in sorted(set(ref["config"]) | set(other["config"])):
            if ref["config"].get(key) != other["config"].get(key):
                raise DAELConfigError(
                    f"rank {rank} runs another run than rank 0: {key} is {other['config'].get(key)!r} there, "
                    f"{ref['config'].get(key)!r} on rank 0; launch every node with the same command"
                )
        for split in sorted(set(ref["data"]) | set(other["data"])):
            a, b = ref["data"].get(split) or {}, other["data"].get(split) or {}
            for domain in sorted(set(a) | set(b)):
                if a.get(domain) != b.get(domain):
                    n0, n1 = (a.get(domain) or {}).get("images"), (b.get(domain) or {}).get("images")
                    raise DAELConfigError(
                        f"rank {rank} reads other data than rank 0: {split} of {domain} has {n1} images there "
                        f"against {n0} on rank 0, or other files (data fingerprint); give every node the same data"
                    )


def from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process (``obj`` off torchrun)."""
    if not _WORLD.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=host_group())
    return box[0]


def barrier() -> None:
    if _WORLD.distributed:
        dist.barrier(group=host_group())


def wrap(module: torch.nn.Module, device_: torch.device) -> torch.nn.Module:
    """``module`` under DistributedDataParallel in a distributed run (itself otherwise).
    Buffers are not broadcast: synchronised batch norm keeps them equal on every process."""
    if not _WORLD.distributed:
        return module
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device_.index] if device_.type == "cuda" else None
    params = inspect.signature(DDP.__init__).parameters
    # Buffers are equal on every process (synchronised batch norm), so no per-forward broadcast.
    sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
    return DDP(module, device_ids=ids, process_group=device_group(), **sync)


def test_indices(n: int) -> range:
    """This process's positions of an ``n``-item test set (every N-th; the union is all of them)."""
    return range(_WORLD.rank, n, _WORLD.size)


class LossModule(torch.nn.Module):
    """The modules of a step and the function that computes its losses, as one module for
    DDP: its forward is the step's forward, so DDP sees one forward per backward."""

    def __init__(self, modules: torch.nn.Module, fn: Any) -> None:
        super().__init__()
        self.inner = modules
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)
