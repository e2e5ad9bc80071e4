"""Which tensor each GEMM of an SP14 trainer's capture reads and writes, against the contract's
table (egf_audit.trace.contract_gemms): EGF001's operand-identity rule.

A capture's GEMMs carry no labels, so each is matched by role, not by position: the tensor it
writes (C, or cuBLASLt's D; each batch of a batched call on its own) picks the contract entries
that write it, and its two read operands must be one of those entries' two read tensors, in
either operand (a trainer may pass them either way round). Tensors are compared by address, so a
tensor the layout names twice (a view, a nested buffer) is the same tensor. A tensor the layout
does not name is not compared: with inference only what inference names is judged. An operand in
a tensor the contract does not name (the trainer's own gradient buffer after an activation
kernel of its own, a scratch) is the trainer's data flow and not judged here: the rule fails a
GEMM that reads a contract tensor in another tensor's role. A GEMM whose
written tensor no entry writes is not this rule's (its span is still judged).

Order: the contract's order within a step binds only where data flows. A GEMM that reads a
tensor a contract GEMM writes must come after a launch of its step that writes (or may write)
its buffer (the backward after the forward, the trunk after d_h_s2's dX GEMMs, a norm after its
power-iteration GEMV): a GEMM, kernel, memset or copy alike, since a trainer may compute a layer
in a kernel of its own; after a write that cannot be placed (an unbound GEMM) nothing is claimed
in that step. GEMMs with no data between them may run in any order (the target forward before
the online one, a branch's dX before its dW).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from egf_audit.invariants.capture_common import where
from egf_audit.trace.buffers import ELEMENT_BYTES
from egf_audit.trace.contract_gemms import CONTRACT_GEMMS, ContractGemm, TensorRef

if TYPE_CHECKING:
    from egf_audit.trace.buffers import CaptureLayout
    from egf_audit.trace.model import Binding, Launch, Trace


def tensor_address(layout: CaptureLayout, ref: TensorRef) -> int | None:
    """Where the layout puts a contract tensor: its buffer's start (a buffer holding one tensor
    of its own name), or its tensor's first element; None when the layout does not name it."""
    buffer = layout.buffers.get(ref.buffer)
    if buffer is None:
        return None
    if ref.tensor == ref.buffer:
        return buffer.base
    shape = buffer.tensors.get(ref.tensor)
    return None if shape is None else buffer.base + shape[0] * ELEMENT_BYTES


def _batches(x: Launch) -> dict[str, dict[str, Binding]]:
    """A GEMM's bindings by batch ("" for the first, "[3]" for batch 3), then by operand."""
    out: dict[str, dict[str, Binding]] = {}
    for b in x.bindings:
        role, bracket, index = b.role.partition("[")
        out.setdefault(bracket + index, {})[role] = b
    return out


def _named(ct: Trace, b: Binding) -> str:
    """An operand's tensor in words: `buffer.tensor`, `buffer` for its own tensor, else where
    its pointer lands."""
    if b.region is not None and b.tensor is not None:
        return b.region.buffer if b.tensor == b.region.buffer else f"{b.region.buffer}.{b.tensor}"
    return where(ct, b.pointer)


# the buffers the contract's GEMMs read and write: an operand elsewhere is the trainer's own
BUFFERS = frozenset(ref.buffer for g in CONTRACT_GEMMS for ref in (g.a, g.b, g.c))


class _Roles:
    """The contract table placed in one process's layout."""

    def __init__(self, ct: Trace) -> None:
        self.ct = ct
        self.address = {
            ref: a
            for g in CONTRACT_GEMMS
            for ref in (g.a, g.b, g.c)
            if (a := tensor_address(ct.capture.layout, ref)) is not None
        }
        self.writers: dict[int, list[ContractGemm]] = {}
        for g in CONTRACT_GEMMS:
            if g.c in self.address:
                self.writers.setdefault(self.address[g.c], []).append(g)

    def missing_reads(self, g: ContractGemm, pointers: list[int]) -> list[TensorRef]:
        """The entry's named read tensors the GEMM's read pointers do not cover (a multiset:
        a norm reads the same vector twice)."""
        want = Counter(self.address[r] for r in g.reads if r in self.address)
        left = want - Counter(pointers)
        return [r for r in g.reads if self.address.get(r) in left]

    def _buffer_at(self, address: int) -> str | None:
        found = self.ct.capture.layout.resolve(address)
        return None if found is None else found[0].name

    def judge(self, x: Launch, written: set[str] | None) -> str | None:
        """Why one GEMM's operands are not a contract entry's, or it runs before its inputs
        were written in its step, or None. `written`: the buffers the step's launches before
        it wrote (or may have written); None where one of them wrote what cannot be placed."""
        for suffix, ops in _batches(x).items():
            out = ops.get("D") or ops.get("C")
            reads = [ops[r] for r in ("A", "B") if r in ops]
            candidates = self.writers.get(out.pointer, []) if out is not None else []
            if out is None or not candidates:
                continue
            pointers = [b.pointer for b in reads]
            scored = [(len(self.missing_reads(g, pointers)), i) for i, g in enumerate(candidates)]
            misses, best = min(scored)
            entry = candidates[best]
            if misses and self._contract_stray(entry, reads):
                return self._wrong_tensor(entry, reads, suffix)
            for ref in entry.reads:
                a = self.address.get(ref)
                if a is None or a not in self.writers or written is None:
                    continue
                if self._buffer_at(a) not in written:
                    producer = self.writers[a][0].label
                    return (
                        f"reads {ref} before any launch of its step wrote it (the contract's "
                        f"{entry.label} runs after {producer})"
                    )
        return None

    def _contract_stray(self, entry: ContractGemm, reads: list[Binding]) -> bool:
        """Whether an operand the entry does not expect lies in a buffer the contract names for
        another role (the target's weights for the online net's, a branch's concat for the dir
        one's): a trainer's own buffer in its place (the gradient after its own activation
        kernel, a scratch of its own) is its data flow, not this rule's."""
        expected = {self.address[r] for r in entry.reads if r in self.address}
        return any(
            b.pointer not in expected and b.region is not None and b.region.buffer in BUFFERS
            for b in reads
        ) or (len(reads) == 2 and reads[0].pointer == reads[1].pointer and len(expected) == 2)

    def _wrong_tensor(self, entry: ContractGemm, reads: list[Binding], suffix: str) -> str:
        expected = {self.address[r] for r in entry.reads if r in self.address}
        stray = next((b for b in reads if b.pointer not in expected), None)
        wanted = self.missing_reads(entry, [b.pointer for b in reads])
        role = stray.role if stray is not None else f"A{suffix}"
        got = _named(self.ct, stray) if stray is not None else "it twice"
        return (
            f"operand {role} reads {got}, where the contract's {entry.label} (writing "
            f"{entry.c}) reads {wanted[0]}"
        )


def _writes(x: Launch) -> tuple[set[str], bool]:
    """The buffers a launch writes or may write (a kernel egf-audit does not know: every named
    buffer it was handed), and whether it may have written memory no binding places (a GEMM
    whose operands are not bound, or whose output is in no named buffer)."""
    if x.kind == "sgemm" and ("unbound" in x.args or not x.bindings):
        return set(), True
    wrote = [b for b in x.bindings if b.writes or "?" in b.access]
    placed = {b.region.buffer for b in wrote if b.region is not None}
    return placed, x.kind == "sgemm" and any(b.region is None for b in wrote)


def role_problems(ct: Trace) -> dict[int, str]:
    """Each GEMM of an SP14 trainer's capture whose operands are not the contract's tensors, or
    that reads a contract GEMM's output before its step wrote it: launch index -> the problem
    (the module docstring says how GEMMs are matched)."""
    if not ct.capture.sp14:
        return {}
    roles = _Roles(ct)
    found: dict[int, str] = {}
    written: dict[int, set[str] | None] = {}  # by step; None: a write that cannot be placed
    for x in ct.launches:
        so_far = written.setdefault(x.step, set())
        if x.kind == "sgemm" and x.bindings and "unbound" not in x.args:
            problem = roles.judge(x, so_far)
            if problem is not None:
                found[x.index] = problem
        placed, unplaced = _writes(x)
        if so_far is not None:
            written[x.step] = None if unplaced else so_far | placed
    return found
