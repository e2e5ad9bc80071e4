"""Torch's one-time CUDA start-up, overlapped with the scenarios instead of paid inside the
invariants.

The first invariants to use torch on the GPU (EGF005, EGF007, EGF010) would otherwise pay,
inside the invariants phase, for what torch does once a process: its CUDA initialisation, its
cuBLAS handle, the caching allocator's first blocks and the first load of every kernel they
launch (CUDA loads a kernel's module on its first launch). `egf-audit run` has the thread that
imported torch beside the scenarios do that work (`warm_up`, cli/beside.py); `start(backend,
config)` starts a thread of its own for it. Either way it runs while the scenarios run on
CuPy: one float64 step of the oracle's math on random tensors of the config's shapes (the same
functions, dtypes and shapes EGF010 runs, and the element-wise and reduction kernels EGF005
and EGF007 use), then it waits for the device. Nothing it computes is kept or read by a check.

Why it is safe: torch and CuPy share the device's primary context; the thread's tensors are
torch's own allocations, which no scenario buffer overlaps, so the only thing shared is the
device's time, and both libraries queue on the default stream, in order. The thread is joined
before the first invariant runs (`Beside.join`, `Warmup.wait`), so the checks never race with
it. It starts only on the CUDA backend (the CPU backend gains nothing and must not touch a
GPU). An error in the thread is kept, never raised: the invariants then meet the same error,
where it is reported.
"""

from __future__ import annotations

import threading
import time

import torch

from egf_audit.oracle import model
from egf_audit.oracle.compare import argmax_flags, relu_flags
from egf_audit.oracle.inputs import _f64
from egf_audit.oracle.tensor_checks import Compared, Joined, Measured
from egf_audit.trace.config_view import ConfigView, DimsView, HyperView
from egf_audit.trace.contract import AUX_DOWN_INDEX, AUX_UP_INDEX, BRANCHES, param_shapes


class Warmup:
    """The background start-up, or nothing (`thread` None) off the CUDA backend."""

    def __init__(self, thread: threading.Thread | None = None):
        self.thread = thread
        self.error: BaseException | None = None
        self.seconds: float | None = None  # the thread's own time, once it finished

    def wait(self) -> None:
        """Join the thread (at once where none runs)."""
        if self.thread is not None:
            self.thread.join()


def start(backend: str, config: ConfigView) -> Warmup:
    """Start torch's CUDA start-up in the background on the CUDA backend; a no-op elsewhere."""
    if backend != "cuda":
        return Warmup()
    warm = Warmup()
    # not a daemon: a process that ends early (a failed scenario) waits for it rather than
    # tearing CUDA down under it
    warm.thread = threading.Thread(
        target=lambda: warm_up(config, warm), name="egf-audit-torch-warmup"
    )
    warm.thread.start()
    return warm


def warm_up(config: ConfigView, warm: Warmup) -> None:
    """The start-up itself, in the calling thread (`start`'s, or the one that imported torch
    beside the scenarios: cli/beside.py): its error and its seconds kept on `warm`."""
    began = time.perf_counter()
    try:
        if torch.cuda.is_available():
            run_once(config.dims, config.hyper, torch.device("cuda"))
            torch.cuda.synchronize()
    except BaseException as exc:  # kept: the checks meet it again where it is reported
        warm.error = exc
    finally:
        warm.seconds = time.perf_counter() - began


def run_once(dims: DimsView, hyper: HyperView, dev: torch.device) -> None:
    """One float64 oracle step on random inputs of `dims`' shapes on `dev`, and the element-wise
    work of EGF005 and EGF007: every kernel and cuBLAS routine they use is loaded after it."""
    gen = torch.Generator(device=dev).manual_seed(0)
    nb = len(BRANCHES)

    def fp32(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, device=dev)

    def index(rows: int, cols: int, high: int) -> torch.Tensor:
        return torch.randint(0, high, (rows, cols), generator=gen, device=dev, dtype=torch.int32)

    shapes = param_shapes(dims)
    sizes = [rows * cols for _, rows, cols in shapes]
    table32 = torch.randn(sum(sizes), generator=gen, device=dev) * 0.05
    flat = _f64(table32)
    params = {
        name: part.view(rows, cols)
        for part, (name, rows, cols) in zip(flat.split(sizes), shapes, strict=True)
    }
    widths = {"h_s1": dims.SH1, "h_s2": dims.SH2, "v_hid": dims.VALH}
    widths.update({f"b{b}_hid": dims.ADV for b in range(nb)})
    acts = {layer: fp32(dims.B, widths[layer]).relu() for layer in model.RELU_LAYERS}
    masks = {layer: _f64(a > 0) for layer, a in acts.items()}
    obs = _f64(fp32(dims.B, dims.OBS))
    context: list[torch.Tensor | None] = [None]
    context += [_f64(fp32(dims.B, dims.E[b])) for b in range(1, nb)]
    actions = index(dims.B, nb, min(dims.A))
    labels = index(dims.B, 1, dims.AUXK)[:, 0]
    alpha = fp32(1, 1)[0, 0].abs().double()
    low_high = torch.stack([x.double() for x in torch.aminmax(actions, dim=0)]).reshape(2, -1)
    torch.cat([low_high, alpha.reshape(1, 1).expand(2, 1)], dim=1).tolist()

    with torch.no_grad():
        target_net = model.forward(params, obs, context, masks)
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    online = model.forward(leaves, obs, context, masks, alpha=alpha)

    # the decisions, as compare_step takes them
    softmax = fp32(dims.B, dims.AUXK).softmax(dim=1)
    wire = (softmax[:, AUX_UP_INDEX] - softmax[:, AUX_DOWN_INDEX])[:, None]
    h_s2 = _f64(acts["h_s2"])
    x32 = {"h_s1": obs, "h_s2": _f64(acts["h_s1"]), "v_hid": h_s2}
    x32["b0_hid"] = torch.cat([h_s2, _f64(wire)], dim=1)
    for b in range(1, nb):
        ctx = context[b]
        assert ctx is not None
        x32[f"b{b}_hid"] = torch.cat([h_s2, ctx], dim=1)
    flags = []
    for layer in model.RELU_LAYERS:
        z = online.pre[layer].detach()
        flags.append(relu_flags(z, model.relu_band(params, layer, z, x32[layer]), acts[layer]))
    argmax = index(dims.B, nb, min(dims.A)).to(torch.int64)
    for b in range(nb):
        q64 = target_net.q_values[b]
        flags.append(argmax_flags(q64, (q64.float().double() - q64).abs(), argmax[:, b]))
        argmax[:, b] = argmax[:, b].clamp(0, dims.A[b] - 1)

    # the gradients and the update
    batch = model.StepBatch(
        actions=actions.to(torch.int64),
        reward=_f64(fp32(dims.B, 1)[:, 0]),
        done=_f64(fp32(dims.B, 1)[:, 0] > 0),
        aux_label=labels.to(torch.int64),
    )
    td_target = model.td_targets(target_net.q_values, argmax, batch, hyper)
    loss = model.total_loss(online, td_target, batch, hyper)
    names = [name for name, _, _ in shapes]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    refs = torch.cat(
        [(g if g is not None else torch.zeros_like(leaves[n])).reshape(-1)
         for n, g in zip(names, grads, strict=True)]
    )  # fmt: skip
    stepped, m1, v1 = model.adam(flat, refs, flat * 0, flat * flat, 1, hyper)
    at = names.index("w_b0fc")
    start_at, (_, rows, cols) = sum(sizes[:at]), shapes[at]
    w_b0fc = stepped[start_at : start_at + rows * cols].view(rows, cols)
    u0 = _f64(fp32(1, dims.ADV))
    projected, u1, v1_sn = model.spectral_norm(w_b0fc, u0, hyper.sigma_max)
    w_b0fc.copy_(projected)
    target = model.polyak(flat, stepped, hyper.tau)
    rows_compared: list[Compared | Joined] = [
        Joined("grad", names, sizes, refs, table32),
        Joined("adam_m", names, sizes, m1, table32),
        Joined("adam_v", names, sizes, v1, table32),
        ("u_b0fc", "sn", u1, fp32(1, dims.ADV)),
        ("v_b0fc", "sn", v1_sn, fp32(1, cols)),
        Joined("target", names, sizes, target, table32),
    ]
    measured = Measured(rows_compared)
    counts = torch.stack(flags).to(torch.float64)
    read = [counts.reshape(-1)]
    read += [measured.values.reshape(-1)] if measured.values is not None else []
    torch.cat(read).tolist()
    _element_wise(table32, dims, gen)


def _element_wise(table32: torch.Tensor, dims: DimsView, gen: torch.Generator) -> None:
    """The kernels of EGF005's Polyak check (bit patterns, ulps) and EGF007's trunk entry that
    the oracle's step does not launch."""
    start, end = table32, table32 * 0.995
    changed = start.view(torch.int32) != end.view(torch.int32)
    torch.where(changed.any(), changed.int().argmax(), -1)
    o, t = start.double(), end.double()
    m32 = (0.005 * o).abs() + (0.995 * t).abs()
    m32 = m32.float()
    ulp = (torch.nextafter(m32, torch.full_like(m32, torch.inf)) - m32).double()
    ulps = (t - o).abs() / ulp
    torch.where(ulps.isnan(), torch.inf, ulps).max()
    torch.count_nonzero(start.view(torch.int32)).double()
    d = torch.randn(dims.B, dims.VALH, generator=gen, device=table32.device).double()
    w = torch.randn(dims.VALH, dims.SH2, generator=gen, device=table32.device).double()
    ref = d @ w
    bound = d.abs() @ w.abs()
    err = (ref - bound).abs()
    torch.stack([(~(err <= bound)).sum().double(), err.max(), (err / bound).max()]).tolist()
