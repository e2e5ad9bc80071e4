"""Inputs for karpathy/llm.c's `train_gpt2_fp32.cu`, in its documented binary formats, and the
layout file that names its tensors: a small GPT-2 (2 layers, 4 heads, 128 channels; GPT-2's
vocabulary, since its sampler starts from token 50256), seeded random weights, and token files
that make exactly two training steps (one validation batch before them and after). llm.c's
forward matmul kernel works in 128 x 128 tiles without bounds checks, so B * T and every
output width (C, 3C, 4C, Vp) are multiples of 128: C = 128 and B * T = 4 * 32.

    python make_inputs.py OUT_DIR [--batch 4] [--seq 32]

writes OUT_DIR/gpt2_124M.bin (the checkpoint path the trainer opens), train.bin, val.bin and
layout.json. llm.c writes no layout file and cannot be changed to, so its buffers are named by
their allocations (docs/capture.md): its parameters, gradients and AdamW moments are four
cudaMallocs of one size, in that order; its activations and the backward scratch one each. The
tensors are llm.c's own tables (fill_in_parameter_sizes, fill_in_activation_sizes), row-major,
stacked over layers with the leading axes the program slices declared (`[L, B*T, C]`, `qkvr`
as `[L, 3, B, NH, T, HS]`: each GEMM operand must cover whole slices, docs/capture.md); the
scratch its kernels use with several shapes (`output`, `bt4c`, `preatt`) is left unnamed,
judged by its allocation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

MODEL_MAGIC, MODEL_VERSION = 20240326, 3  # gpt2_build_from_checkpoint
DATA_MAGIC, DATA_VERSION = 20240520, 1  # dataloader_load_shard_
HEADER_INTS = 256
L, NH, C, MAX_T, V, VP = 2, 4, 128, 64, 50257, 50304


Shape = tuple[int, ...]


def parameter_tensors() -> list[tuple[str, Shape]]:
    """fill_in_parameter_sizes, row-major, each per-layer weight declared with its layer axis
    (`qkvw` as [L, 3C, C]: each layer's GEMM reads one [3C, C] slice)."""
    return [
        ("wte", (VP, C)), ("wpe", (MAX_T, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)),
        ("attprojb", (L, C)), ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)),
        ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (1, C)),
        ("lnfb", (1, C)),
    ]  # fmt: skip


def activation_tensors(B: int, T: int) -> list[tuple[str | None, Shape]]:
    """fill_in_activation_sizes, each stacked over layers (and heads) as the GEMMs slice it:
    `ln1` [L, B*T, C], `att` [L, B, NH, T, T], `qkvr` [L, 3, B, NH, T, HS]. None: scratch used
    with several shapes, left unnamed (gpt2_backward reuses atty and fch as per-head buffers;
    `output` holds the QKV, the logits and their gradient)."""
    BT, HS = B * T, C // NH
    return [
        ("encoded", (BT, C)), ("ln1", (L, BT, C)), ("ln1_mean", (L, BT)), ("ln1_rstd", (L, BT)),
        (None, (L * BT, C)),  # atty: gpt2_backward's buffer_a, per-head blocks of T x HS
        ("att", (L, B, NH, T, T)), ("attproj", (L, BT, C)),
        ("residual2", (L, BT, C)), ("ln2", (L, BT, C)), ("ln2_mean", (L, BT)),
        ("ln2_rstd", (L, BT)),
        (None, (L * BT, 4 * C)),  # fch: gpt2_backward's buffer_b, B*NH blocks of T x T
        ("fch_gelu", (L, BT, 4 * C)), ("fcproj", (L, BT, C)),
        ("residual3", (L, BT, C)), ("lnf", (BT, C)), ("lnf_mean", (1, BT)), ("lnf_rstd", (1, BT)),
        ("losses", (1, BT)), ("qkvr", (L, 3, B, NH, T, HS)),
        (None, (BT, max(3 * C, NH * T, VP))),  # output: logits, their gradient, scratch
    ]  # fmt: skip


def grad_act_tensors(B: int, T: int) -> list[tuple[str | None, Shape]]:
    """fill_in_grad_act_sizes: bt4c and preatt are scratch of several shapes."""
    BT = B * T
    return [(None, (BT, 4 * C)), (None, (B * NH * T, T)), ("dresidual", (BT, C))]


def packed(tensors: list[tuple[str | None, Shape]], prefix: str = "") -> tuple[dict, int]:
    """The layout file's tensors, [offset, *shape], packed in order; and their total size."""
    out, offset = {}, 0
    for name, shape in tensors:
        if name is not None:
            out[prefix + name] = [offset, *shape]
        offset += int(np.prod(shape))
    return out, offset


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_inputs.py")
    parser.add_argument("out", type=Path)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    args = parser.parse_args(argv)
    B, T = args.batch, args.seq
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    params, n_params = packed(parameter_tensors())
    header = np.zeros(HEADER_INTS, np.int32)
    header[:8] = [MODEL_MAGIC, MODEL_VERSION, MAX_T, V, L, NH, C, VP]
    weights = (0.02 * rng.standard_normal(n_params)).astype(np.float32)
    (out / "gpt2_124M.bin").write_bytes(header.tobytes() + weights.tobytes())
    for name, batches in (("train.bin", 2), ("val.bin", 1)):
        tokens = rng.integers(0, V, batches * B * T + 1, dtype=np.uint16)
        head = np.zeros(HEADER_INTS, np.int32)
        head[:3] = [DATA_MAGIC, DATA_VERSION, tokens.size]
        (out / name).write_bytes(head.tobytes() + tokens.tobytes())
    acts, n_acts = packed(activation_tensors(B, T))
    grad_acts, n_grad_acts = packed(grad_act_tensors(B, T))
    by_allocation = {
        "params_memory": (n_params, 0, params),
        "grads_memory": (n_params, 1, packed(parameter_tensors(), "grad_")[0]),
        "m_memory": (n_params, 2, {}),
        "v_memory": (n_params, 3, {}),
        "acts_memory": (n_acts, 0, acts),
        "grads_acts_memory": (n_grad_acts, 0, grad_acts),
    }
    layout = {
        "format": "egf-audit-layout/1",
        "dims": {"B": B, "T": T, "C": C, "NH": NH, "L": L, "Vp": VP},
        "buffers": {
            name: {"allocation": {"bytes": 4 * n, "index": index}, "tensors": tensors}
            for name, (n, index, tensors) in by_allocation.items()
        },
    }
    (out / "layout.json").write_text(json.dumps(layout, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
