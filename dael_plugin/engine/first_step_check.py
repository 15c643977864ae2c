"""Insurance for what a CPU test cannot see: on the first training step on CUDA, the fused
``grouped`` batch-norm pass is checked on that very batch.

Three passes run on copies of the backbone (the model, its running statistics and every random
stream are left as they were): per-chunk batch norm (``split``: each chunk through torch's own
kernel) in float64, the reference; the same in the step's precision; and the fused pass in the
step's precision. Each is one forward pass of the chunks the step's own fused call takes
(``DAEL.gradient_parts``: the views that take a gradient, for its LOSSES and VIEWS) and one
backward pass of a fixed random projection of the features, with full fp32 products where the
step uses TF32. The outputs, and all parameters' gradients together, are
compared with the reference by the norm of their difference relative to the reference's.

What is compared, each against the float64 reference:

- the features (all outputs together), and all parameters' gradients together;
- **each batch-norm layer alone** (:func:`compare_kernels`): on the input it had in the step's pass
  (captured at that layer, once per call, whatever order the layers were registered in), with a
  fixed upstream gradient, its output, its input's gradient, its weight and bias gradients and its
  running statistics. Upstream rounding is out of it, so a correct kernel is
  within 2e-7 of float64 in fp32 and within the output's rounding in bf16, and a defect confined to
  one layer (its weight gradient 10% off) is a 10% error there, where in the whole gradient it is a
  fraction of a per-mille.

Each quantity passes when the fused pass is about as accurate as torch's own kernel in the same
precision: an error at most ``RATIO`` times per-chunk batch norm's error plus a floor (``FLOOR``
for the outputs and all gradients together, ``KERNEL_FLOOR`` for a layer alone). Comparing the
two fp32 passes with each other instead would not do: a channel that is nearly constant in a chunk
(a dead ReLU at initialisation) makes batch norm ill-conditioned, and two correct fp32 kernels
then differ by up to 5e-3 in the gradients (measured on the H200 and on CPU), either one the
closer to float64. The ratio to torch's own kernel's error carries that: where per-chunk batch norm
is itself far from float64 (a layer whose weight gradient cancels), the allowance grows with it.
A defect in the fused kernels (statistics over the wrong elements, a wrong gradient formula, a
wrong running-statistics update) shows as an error of order one, or of the defect's size in its
layer.

When the step is compiled (``COMPILE default`` or ``reduce-overhead``), the fused kernel runs its
compiled branch (``torch.compiler.is_compiling()``: out-of-place runs, concatenated), not the
eager one; the check then compiles the whole fused pass with the step's backend (the kernels, not
CUDA graphs) and checks that branch there, also per layer: weight and bias gradients and running
statistics against ``RATIO`` x per-chunk's error + ``LAYER_FLOOR``. That is one more compilation of
the backbone's forward and backward, once per process start. Layers alone are checked eager: the
compiled branch differs from the eager one in how it writes (out of place, concatenated), not in
its arithmetic, and compiling each layer apart would cost a compilation per layer shape.

On a failed check the step falls back to ``CHUNK_BN split`` with one log line naming the worst
quantity (under torchrun, where the synchronised form shares the kernels, the run stops), and
``results.json`` records the check (``fast_path_check``). Its cost is about two extra training
steps (one in float64), once per process start.

What it cannot see: a defect that appears only at shapes or chunk sizes other than the first
batch's (the loaders drop last batches, so every step has them), the synchronised form's
collectives (one process's copy is checked), a defect smaller than the allowance, and in the
compiled branch under bf16/fp16 a one-layer defect that upstream rounding hides (see LAYER_FLOOR).
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from dael_plugin.core.chunk_norm import fused_forward

# The fused pass passes where its error against a float64 reference is at most RATIO times that of
# per-chunk batch norm in the same precision, plus a floor (errors as norms, relative).
RATIO = 4.0
# The floors: fp32's forward rounding, amplified by batch norm on nearly constant channels, leaves
# both fp32 passes 1e-4 to 5e-3 from float64 in the gradients (CPU: ResNet-18, the small CNN and
# Dassl's cnn_digit5_m3sda; the H200: 5e-7 to 5e-3), either one ahead; bf16/fp16 4e-3 to 6e-3
# (the H200). A wrong kernel is off by order one.
FLOOR = {"fp32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}
# The floors for one layer's weight and bias gradients and running statistics in the whole pass (the
# compiled branch). Upstream rounding compounds there: on CPU two correct fp32 passes part by up to 8e-3
# in a layer of ResNet-18, and bf16 passes by 0.2 (CPU autocast; the H200's bf16 is far closer), so this
# sees x1.1 in fp32 and can miss x1.5 in bf16, which the eager kernels' check alone (KERNEL_FLOOR) sees.
LAYER_FLOOR = {"fp32": 3e-2, "bf16": 0.2, "fp16": 0.2}
LAYER_QUANTITIES = ("weight_grad", "bias_grad", "running_mean", "running_var")
# Each layer alone on its own input (compare_kernels): fp32 kernels are within about 1e-6 of float64
# there, and bf16/fp16 within the output's rounding (about 4e-3); a wrong kernel is off by its defect.
# Measured on CPU (SmallCNN, ResNet-18, 4 chunks of 16): fp32 at most 2e-7, bf16 2.4e-3; a planted x1.1
# (fp32) or x1.5 (bf16) on one layer's weight gradient is 0.1 or 0.5 there. The floors sit a decade from
# both: a false alarm costs a torchrun run its stop, and a missed defect a wrong result.
KERNEL_FLOOR = {"fp32": 1e-2, "bf16": 5e-2, "fp16": 5e-2}
KERNEL_QUANTITIES = ("output", "input_grad") + LAYER_QUANTITIES


def _rel(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all the tensors together (one number for all parameters' gradients:
    a parameter whose gradient is tiny cannot dominate it with rounding noise)."""
    diff = torch.stack([(x.double() - y.double()).square().sum() for x, y in zip(a, b)]).sum().sqrt()
    norm = torch.stack([y.double().square().sum() for y in b]).sum().sqrt()
    return (diff / norm.clamp_min(1e-300)).item()


def _copy_unsynced(net: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``net`` whose batch-norm layers normalise this process's batch alone (a
    process group cannot be copied, and the comparison is of the kernels)."""
    synced = [(m, m._dael_sync, m._dael_world) for m in net.modules() if getattr(m, "_dael_sync", None) is not None]
    for m, _, _ in synced:
        m._dael_sync, m._dael_world = None, 1
    try:
        return copy.deepcopy(net)
    finally:
        for m, group, world in synced:
            m._dael_sync, m._dael_world = group, world


def compare_fused_pass(
    featurizer: torch.nn.Module,
    x: torch.Tensor,
    chunk_sizes: Sequence[int],
    impl: str,
    autocast: Callable[[], object],
    compile_backend: Optional[str] = None,
) -> Dict[str, object]:
    """Relative errors, against per-chunk batch norm in float64, of the fused ``impl`` pass
    (``output``, ``gradients``) and of per-chunk batch norm in the step's precision
    (``reference_output``, ``reference_gradients``) on ``x``; and per batch-norm layer (``layers``:
    its name, and for each of :data:`LAYER_QUANTITIES` it has, ``(fused error, per-chunk error)``), in
    the whole pass (``layers``) and alone on its own input (``kernels``, :func:`compare_kernels`,
    eager). ``compile_backend``: the whole fused pass runs compiled with that backend (the step's
    compiled branch)."""
    passes: Dict[str, tuple] = {}
    # (layer name, input) of each batch-norm call in the step's precision (split pass), in call order
    inputs: List[Tuple[str, torch.Tensor]] = []
    devices = [x.device] if x.device.type == "cuda" else []
    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    # Full fp32 convolutions and matmuls while checking: TF32 rounds every product to 10 bits and
    # would hide what the batch norms themselves do. (The step itself keeps USE_TF32's setting.)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.random.fork_rng(devices=devices):  # every random stream as it was (dropout draws)
            for name, mode, exact in (("exact", "split", True), ("split", "split", False), ("fused", impl, False)):
                backend = compile_backend if name == "fused" else None
                capture = inputs if name == "split" else None
                passes[name] = _one_pass(featurizer, x, chunk_sizes, mode, autocast, exact, backend, capture)
            kernels = compare_kernels(featurizer, inputs, chunk_sizes, impl, autocast)
            del inputs[:]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
    (ey, eg, el), (sy, sg, sl), (fy, fg, fl) = passes["exact"], passes["split"], passes["fused"]
    layers = []
    for name, e, s_, f in zip([n for n, _ in _norms(featurizer)], el, sl, fl):
        layers.append({"layer": name, **_errors(f, s_, e)})
    return {
        "output": _rel([fy], [ey]),
        "gradients": _rel(fg, eg) if eg else 0.0,
        "reference_output": _rel([sy], [ey]),
        "reference_gradients": _rel(sg, eg) if eg else 0.0,
        "layers": layers,
        "kernels": kernels,
    }


def _errors(fused: Dict[str, torch.Tensor], split: Dict[str, torch.Tensor], exact: Dict[str, torch.Tensor]):
    """``{quantity: (fused error, per-chunk error)}`` against ``exact``; a quantity the fused pass
    lacks (a kernel that gave no weight gradient) is an infinite error."""
    return {
        q: (_rel([fused[q]], [e]) if q in fused else math.inf, _rel([split[q]], [e]) if q in split else math.inf)
        for q, e in exact.items()
    }


def _norms(net: torch.nn.Module):
    """``(name, layer)`` of every batch-norm layer, in module order (the same in every copy)."""
    return [(n or "(root)", m) for n, m in net.named_modules() if isinstance(m, _BatchNorm)]


def _layer_state(net: torch.nn.Module) -> List[Dict[str, torch.Tensor]]:
    """Each batch-norm layer's weight and bias gradients and running statistics, as float64."""
    out = []
    for _, m in _norms(net):
        got = {
            "weight_grad": m.weight.grad if m.weight is not None else None,
            "bias_grad": m.bias.grad if m.bias is not None else None,
            "running_mean": m.running_mean,
            "running_var": m.running_var,
        }
        out.append({q: t.detach().double() for q, t in got.items() if t is not None})
    return out


def _one_pass(
    featurizer, x, chunk_sizes, mode: str, autocast, exact: bool, compile_backend=None, capture=None
) -> tuple:
    """Features, parameter gradients of a fixed random projection of them, and each batch-norm
    layer's state (:func:`_layer_state`), on a copy of the backbone: in float64 without autocast
    (``exact``), or as the step runs (compiled with ``compile_backend`` when given)."""
    net = _copy_unsynced(featurizer)
    # Batch norm in training mode, everything else in evaluation mode: no dropout or drop-path draws,
    # whose masks would differ between the passes (CUDA's dropout draws its mask by dtype).
    net.eval()
    for m in net.modules():
        if isinstance(m, _BatchNorm):
            m.train()
    if exact:
        net = net.double()
    for p in net.parameters():
        p.grad = None
    sizes = [int(s) for s in chunk_sizes]

    def forward(inp):
        with contextlib.nullcontext() if exact else autocast():
            return fused_forward(net, inp, sizes, mode)

    if compile_backend is not None:  # the compiled branch, as the step's compiled forward runs it
        forward = torch.compile(forward, backend=compile_backend, fullgraph=True, dynamic=False)
    hooks = []
    if capture is not None:  # each batch-norm call's input, keyed by its layer, for the kernel check
        for name, m in _norms(net):
            hooks.append(m.register_forward_pre_hook(lambda _m, args, n=name: capture.append((n, args[0].detach()))))
    try:
        feats = forward(x.double() if exact else x)
    finally:
        for h in hooks:
            h.remove()
    gen = torch.Generator(device=x.device).manual_seed(0)
    probe = torch.randn(feats.shape, generator=gen, device=x.device, dtype=torch.float64)
    (feats.double() * probe).sum().backward()
    grads = [p.grad.detach().double() for p in net.parameters() if p.grad is not None]
    return feats.detach().double(), grads, _layer_state(net)


def _kernel_pass(
    bn, x: torch.Tensor, sizes: Sequence[int], mode: str, autocast, exact: bool
) -> Dict[str, torch.Tensor]:
    """One batch-norm layer alone on its captured input ``x``: its output, its input's gradient for a
    fixed random upstream gradient, its weight and bias gradients and running statistics, as float64.
    ``exact``: the layer and ``x`` (widened exactly) in float64, per chunk (the reference)."""
    layer = _copy_unsynced(bn)
    layer.train()
    if exact:
        layer = layer.double()
    for p in layer.parameters():
        p.grad = None
    inp = (x.double() if exact else x).clone().requires_grad_()
    with contextlib.nullcontext() if exact else autocast():
        y = fused_forward(layer, inp, [int(s) for s in sizes], mode)
    gen = torch.Generator(device=x.device).manual_seed(1)
    upstream = torch.randn(y.shape, generator=gen, device=x.device, dtype=torch.float64)
    (y.double() * upstream).sum().backward()
    out = {"output": y.detach().double(), "input_grad": inp.grad.detach().double()}
    (state,) = _layer_state(layer)
    return {**out, **state}


def compare_kernels(
    featurizer: torch.nn.Module,
    inputs: Sequence[Tuple[str, torch.Tensor]],
    chunk_sizes: Sequence[int],
    impl: str,
    autocast,
) -> List[Dict[str, object]]:
    """Each batch-norm call in isolation, on the input it had in the step's pass (``inputs``: the
    layer's name and that input, in call order): the fused ``impl`` kernel and per-chunk batch norm
    in the step's precision, each against float64 on the same input. Each input goes to the layer
    it was captured at, whatever order the layers were registered in; a layer called twice is
    checked once per call (``"name (call 2)"``), and one never called is not checked. Upstream
    rounding is out of it, so the error is the kernel's own (fp32 about 1e-6, bf16 the output's
    rounding), and a defect in one kernel is its own size (x1.1 is 0.1)."""
    layers = dict(_norms(featurizer))
    calls = {name: sum(n == name for n, _ in inputs) for name in layers}
    seen: Dict[str, int] = {}
    out = []
    for name, x in inputs:
        seen[name] = seen.get(name, 0) + 1
        bn = layers[name]
        exact = _kernel_pass(bn, x, chunk_sizes, "split", autocast, True)
        split = _kernel_pass(bn, x, chunk_sizes, "split", autocast, False)
        fused = _kernel_pass(bn, x, chunk_sizes, impl, autocast, False)
        label = name if calls[name] == 1 else f"{name} (call {seen[name]})"
        out.append({"layer": label, **_errors(fused, split, exact)})
    return out


def layer_failures(
    layers: Sequence[Dict[str, object]], prec: str, floors: Optional[Dict[str, float]] = None
) -> List[Dict[str, object]]:
    """The layers' quantities over their allowance (``RATIO`` x per-chunk's error + the floor for
    ``prec``: ``LAYER_FLOOR`` unless ``floors`` says), worst first, each as ``{layer, quantity,
    error, reference, allowed}``."""
    floor = (floors or LAYER_FLOOR)[prec]
    bad = []
    for entry in layers:
        for q in KERNEL_QUANTITIES:
            if q in entry:
                err, ref = entry[q]
                allowed = RATIO * ref + floor
                if not err <= allowed:  # NaN fails too
                    bad.append(
                        {"layer": entry["layer"], "quantity": q, "error": err, "reference": ref, "allowed": allowed}
                    )
    return sorted(bad, key=lambda b: -(b["error"] - b["allowed"]) if math.isfinite(b["error"]) else -math.inf)


class FirstStepCheck:
    """Runs :func:`compare_fused_pass` once, on the first step's batch, and says what it found.
    ``compile_backend``: the step is compiled with it, so its compiled branch is the one checked."""

    def __init__(self, prec: str, compile_backend: Optional[str] = None) -> None:
        self.prec = prec
        self.compile_backend = compile_backend
        self.result: Optional[Dict[str, object]] = None

    def __call__(self, algorithm, x: torch.Tensor, chunk_sizes: Sequence[int], autocast) -> None:
        from dael_plugin.core.chunk_norm import resolve_impl

        impl = resolve_impl(algorithm.chunk_bn, x.device.type)
        errors = compare_fused_pass(algorithm.featurizer, x, chunk_sizes, impl, autocast, self.compile_backend)
        layers, kernels = errors.pop("layers"), errors.pop("kernels")
        floor = FLOOR[self.prec]
        whole_ok = all(errors[k] <= RATIO * errors[f"reference_{k}"] + floor for k in ("output", "gradients"))
        failures = layer_failures(kernels, self.prec, KERNEL_FLOOR)
        for f in failures:
            f["where"] = "alone"
        if self.compile_backend is not None:  # the compiled branch is seen in the whole pass alone
            for f in layer_failures(layers, self.prec):
                failures.append({**f, "where": "in the whole pass"})
        ok = whole_ok and not failures
        worst = max(
            ((e[q][0] - RATIO * e[q][1], e["layer"], q, *e[q]) for e in kernels for q in KERNEL_QUANTITIES if q in e),
            default=None,
            key=lambda w: w[0] if math.isfinite(w[0]) else math.inf,
        )
        self.result = {
            "impl": impl,
            "prec": self.prec,
            "compiled": self.compile_backend is not None,
            "ratio": RATIO,
            "floor": floor,
            "layer_floor": LAYER_FLOOR[self.prec],
            "kernel_floor": KERNEL_FLOOR[self.prec],
            **errors,
            "layers_checked": len(kernels),
            "closest": None
            if worst is None
            else {"layer": worst[1], "quantity": worst[2], "error": worst[3], "reference": worst[4]},
            "layer_failures": failures[:8],
            "fell_back": not ok,
        }
        branch = "compiled" if self.compile_backend is not None else "eager"
        said = (
            f"outputs {errors['output']:.1e} (per-chunk {errors['reference_output']:.1e}), gradients "
            f"{errors['gradients']:.1e} (per-chunk {errors['reference_gradients']:.1e}) against float64"
        )
        if worst is not None:
            said += (
                f"; {len(kernels)} layers alone, closest to its allowance: {worst[1]} {worst[2]} {worst[3]:.1e} "
                f"(per-chunk {worst[4]:.1e})"
            )
        if ok:
            print(f"dael_plugin: first-step check of the fused {impl} batch norm ({branch}): {said}")
            return
        algorithm.chunk_bn = "split"
        if failures:
            b = failures[0]
            said = (
                f"layer {b['layer']} {b['where']}: {b['quantity']} {b['error']:.1e} against float64 (per-chunk "
                f"{b['reference']:.1e}, "
                f"allowed {b['allowed']:.1e}); {len(failures)} quantities over; {said}"
            )
        whole = f", in the whole pass + {LAYER_FLOOR[self.prec]:g}" if self.compile_backend is not None else ""
        print(
            f"dael_plugin: the fused {impl} batch norm ({branch}) is less accurate than per-chunk batch norm on this "
            f"device ({said}; allowed {RATIO:g}x + {floor:g}, a layer alone + {KERNEL_FLOOR[self.prec]:g}{whole}); "
            "falling back "
            "to CHUNK_BN split for this run (recorded in results.json)"
        )
