"""The GPU's kernel worker (runtime/backends/cuda_worker.py), as far as it runs without a GPU:
the pointer translation and a start that fails. The launches themselves are tested on the GPU
(test_integrity_effects.py)."""

from __future__ import annotations

import pytest

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.backends import cuda_usable
from egf_audit.runtime.backends.cuda_worker import GpuKernelWorker, SharedAllocations


def test_a_pointer_is_found_in_the_allocation_that_holds_it():
    shared = SharedAllocations([(0x3000, 0x100, b"c"), (0x1000, 0x200, b"a")])
    assert shared.containing(0x1000) == (0x1000, 0x200, b"a")
    assert shared.containing(0x11FF) == (0x1000, 0x200, b"a")
    assert shared.containing(0x30FF) == (0x3000, 0x100, b"c")
    for outside in (0x0FFF, 0x1200, 0x2FFF, 0x3100):
        assert shared.containing(outside) is None


@pytest.mark.skipif(cuda_usable()[0], reason="a usable GPU: the worker starts")
def test_a_worker_that_cannot_start_is_one_environment_line():
    with pytest.raises(AuditEnvironmentError) as caught:
        GpuKernelWorker([], device=0, timeout_s=1.0)
    message = str(caught.value)
    assert message.startswith("the kernel worker failed: "), message
    assert "\n" not in message
