"""What the wire gate must leave in the wire column: EGF003's and EGF004's one rule, for the
rebuild's snapshots (torch tensors on the oracle's device) and a capture's values (arrays) alike.
"""

from __future__ import annotations

from typing import overload

import numpy as np
import torch


@overload
def gated(alpha: np.float32, g: np.ndarray) -> np.ndarray: ...
@overload
def gated(alpha: np.float32, g: torch.Tensor) -> torch.Tensor: ...
def gated(alpha: np.float32, g: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """What the scale must leave in the wire: one fp32 multiply, exactly what the kernel
    computes (the rebuild and the capture compare bits with this). Arrays give an array (a
    capture's values), tensors a tensor on their device (the rebuild's snapshots)."""
    if isinstance(g, torch.Tensor):
        factor = torch.tensor(float(np.float32(alpha)), dtype=torch.float32, device=g.device)
        return factor * g.to(torch.float32)
    return np.float32(alpha) * np.asarray(g, dtype=np.float32)


@overload
def expected_wire(alpha: np.float32, g: np.ndarray) -> np.ndarray: ...
@overload
def expected_wire(alpha: np.float32, g: torch.Tensor) -> torch.Tensor: ...
def expected_wire(alpha: np.float32, g: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """The wire column the scale must leave, given the gate `alpha` it read and the wire `g`
    before it, compared bit for bit: at gate 0 exactly +0.0 on every row, whatever g holds (a
    multiply would leave -0.0 for a negative g and NaN for a NaN or an infinity: only an
    explicit alpha == 0 branch closes the wire; only g's shape is read); otherwise
    fl(alpha * g) (a gate outside [0, 1] is EGF012's to fail; here it is held to its product)."""
    if alpha == 0.0:
        if isinstance(g, torch.Tensor):
            return torch.zeros(g.shape, dtype=torch.float32, device=g.device)
        return np.zeros(np.shape(g), dtype=np.float32)
    return gated(alpha, g)
