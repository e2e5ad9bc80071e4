"""The one interface every launch goes through: SGEMM, kernel, memset, copy, upload.

Instrumented mode records each launch in order with its raw arguments, resolves every pointer to
(buffer, region, tensor), and takes snapshots at named checkpoints. An out-of-bounds launch is
recorded and NOT executed, so the audit reports it instead of corrupting memory. Every executed
launch is watched (runtime/launch_watch.py, runtime/guards.py, trace/effects.py): each buffer is
compared bitwise with its state before the launch outside the regions the launch declares it
writes, the backend's guard zones are checked after every kernel, and a kernel whose process
crashed, exited or hung is recorded so, its later launches skipped. Plain mode runs the same
calls with all of that off.

On the CPU each launch's observation is made before the next launch runs. On the GPU it is queued
behind the launch on the device (backends/cuda_observe.py) and only the buffers the launch can
reach are compared; the findings reach the host, and the launches their effects, when the trace
is read (`Recorder.trace` settles every queued observation first), so no launch waits for its
own. Until then a queued launch carries no effects, which EGF013 would fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import KERNELS_BY_NAME, THREADS_PER_BLOCK, blocks_for
from egf_audit.runtime import costs as cost_kinds
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.guards import LaunchFailed
from egf_audit.runtime.launch_watch import LaunchSite, LaunchWatcher
from egf_audit.runtime.memory import AddressMap, Layout
from egf_audit.trace import gemm_rules
from egf_audit.trace.effects import Effects
from egf_audit.trace.gemm_rules import GemmShape, gemm_operand_boxes
from egf_audit.trace.model import Binding, Launch, Region, Snapshot, Trace, recorded_launch


class Recorder:
    def __init__(
        self,
        backend: Backend,
        address_map: AddressMap,
        layout: Layout,
        instrumented: bool = True,
        scenario: str = "plain",
        capture_inputs_of: frozenset[str] = frozenset(),
    ):
        self.backend = backend
        self.amap = address_map
        self.layout = layout
        self.instrumented = instrumented
        self.capture_inputs_of = capture_inputs_of
        self.step = 0
        # Every step repeats the same launches with the same pointers: a binding is computed
        # once per distinct (role, pointer, access, box) and shared (Binding is immutable), and
        # a launch's site (its bindings, exemptions, reach) once per distinct set of the
        # arguments they depend on.
        self._bindings: dict[tuple, Binding] = {}
        self._sites: dict[tuple, LaunchSite] = {}
        self._trace = Trace(scenario=scenario, backend=backend.name, layout=layout.as_dict())
        self.costs = cost_kinds.current()  # set while `egf-audit bench --profile` profiles
        self.watcher = LaunchWatcher(backend, address_map, layout, self.costs, scenario)
        self._started = time.perf_counter()

    def settle(self) -> None:
        """Bring every queued observation's findings onto its launch (launch_watch.py)."""
        self.watcher.settle(self._trace.launches)

    @property
    def trace(self) -> Trace:
        """The recording, every queued observation settled onto its launch."""
        self.settle()
        if self.costs is not None:
            self.costs.span(self._trace.scenario, time.perf_counter() - self._started)
        return self._trace

    # ---- binding ----
    def _bind(self, role: str, ptr: int, access: str, box: tuple[int, int, int, int]) -> Binding:
        key = (role, ptr, access, box)
        binding = self._bindings.get(key)
        if binding is None:
            binding = self._bindings[key] = self._resolve(role, ptr, access, box)
        return binding

    def _resolve(self, role: str, ptr: int, access: str, box: tuple[int, int, int, int]) -> Binding:
        rel, rows, width, ld = box
        where = self.amap.resolve(ptr)
        if where is None:
            return Binding(role, ptr, access, None, None, None, ptr == 0 and rows * width == 0)
        buffer, offset = where
        spec = self.layout.buffer(buffer)
        region = Region(buffer, offset + rel, rows, width, ld)
        tensor = spec.tensor_at(region.offset)
        in_bounds = region.fits(spec.size)
        shape = (tensor.offset, tensor.rows, tensor.cols) if tensor else None
        return Binding(role, ptr, access, region, tensor.name if tensor else None, shape, in_bounds)

    def _site(self, key: tuple, bindings: tuple[Binding, ...]) -> LaunchSite:
        """The site of the launches whose bindings depend on `key` alone, kept for the next."""
        exempt: dict[int, tuple[tuple[int, int, int, int], ...]] = {}
        reach: dict[int, None] = {}
        for b in bindings:
            if b.region is None:
                continue
            base = self.amap.bases[b.region.buffer]
            reach[base] = None
            if b.writes:
                r = b.region
                exempt[base] = (*exempt.get(base, ()), (r.offset, r.rows, r.width, r.ld))
        site = self._sites[key] = LaunchSite(bindings, exempt, tuple(reach))
        return site

    def _record(
        self,
        kind: str,
        name: str,
        label: str,
        args: dict,
        site: LaunchSite | None,
        run: Callable[[], None],
    ) -> None:
        """Run the launch (unless refused) and, instrumented, append it with what it did.
        `site` is None only when not instrumented."""
        if site is None:
            try:
                run()
            except LaunchFailed as exc:
                raise AuditEnvironmentError(f"kernel {name} ({label}) {exc.what}") from None
            return
        launches = self._trace.launches
        index = len(launches)
        executed = site.executed
        effects: Effects | None = None
        failed_before = self.backend.failed_kernels.get(name) if kind == "kernel" else None
        if executed and failed_before is not None:
            executed, effects = False, Effects(not_run=failed_before)
        elif executed:
            if label in self.capture_inputs_of:
                self._capture_inputs(label, site.bindings)
            failure = self.watcher.run(index, name, label, run)
            if self.watcher.queues:
                # the observation is queued behind the launch; `settle` brings its findings
                launch = recorded_launch(
                    index, self.step, kind, name, label, args, site.bindings, True, None
                )
                launches.append(launch)
                self.watcher.queue(site, kind, name, index, launch, failure)
                return
            effects = self.watcher.observe(kind, site, failure)
        launches.append(
            recorded_launch(
                index, self.step, kind, name, label, args, site.bindings, executed, effects
            )
        )

    def _capture_inputs(self, label: str, bindings: tuple[Binding, ...]) -> None:
        buffers = sorted({b.region.buffer for b in bindings if b.reads and b.region})
        self._trace.snapshots[(self.step, f"input:{label}")] = self._snapshot(buffers)

    # ---- launches ----
    def sgemm(
        self,
        label: str,
        transa: str,
        transb: str,
        m: int,
        n: int,
        k: int,
        alpha: float,
        a: int,
        lda: int,
        b: int,
        ldb: int,
        beta: float,
        c: int,
        ldc: int,
    ) -> None:
        args = {
            "transa": transa,
            "transb": transb,
            "m": m,
            "n": n,
            "k": k,
            "alpha": alpha,
            "A": a,
            "lda": lda,
            "B": b,
            "ldb": ldb,
            "beta": beta,
            "C": c,
            "ldc": ldc,
        }
        shape = GemmShape(transa, transb, m, n, k, lda, ldb, ldc)
        refusal = gemm_rules.invalid_value(shape)
        if self.instrumented and refusal is not None:
            # cuBLAS runs nothing: no operand is touched, and the launch says why
            self._trace.launches.append(
                Launch(
                    len(self._trace.launches),
                    self.step,
                    "sgemm",
                    "sgemm",
                    label,
                    args,
                    (),
                    executed=False,
                    refused=refusal,
                )
            )
            return
        site = None
        if self.instrumented:
            c_access = "w" if beta == 0.0 else "rw"
            key = ("sgemm", transa, transb, m, n, k, a, lda, b, ldb, c, ldc, c_access)
            site = self._sites.get(key)
            if site is None:
                boxes = gemm_operand_boxes(shape)
                site = self._site(
                    key,
                    (
                        self._bind("A", a, "r", (0, *boxes["A"])),
                        self._bind("B", b, "r", (0, *boxes["B"])),
                        self._bind("C", c, c_access, (0, *boxes["C"])),
                    ),
                )
        self._record(
            "sgemm",
            "sgemm",
            label,
            args,
            site,
            lambda: self.backend.sgemm(
                transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
            ),
        )

    def kernel(self, label: str, name: str, **args: Any) -> None:
        spec = KERNELS_BY_NAME[name]
        values = [args[p] for p, _ in spec.params]
        threads = spec.threads(args)
        blocks = blocks_for(threads)
        site = None
        if self.instrumented:
            # Boxes depend on pointers and integer arguments only, never on float ones (Adam's
            # bias corrections change every step and would defeat the memo).
            key = (name, *[args[p] for p in spec.layout_params])
            site = self._sites.get(key)
            if site is None:
                site = self._site(
                    key,
                    tuple(
                        self._bind(a.param, args[a.param], a.mode, a.box(args))
                        for a in spec.accesses
                    ),
                )
        recorded = dict(args, grid=blocks, block=THREADS_PER_BLOCK)
        self._record(
            "kernel",
            name,
            label,
            recorded,
            site,
            lambda: self.backend.launch(spec, blocks, THREADS_PER_BLOCK, values),
        )

    def memset_zero(self, label: str, ptr: int, count: int) -> None:
        site = None
        if self.instrumented:
            key = ("memset", ptr, count)
            site = self._sites.get(key)
            if site is None:
                site = self._site(key, (self._bind("dst", ptr, "w", (0, 1, count, count)),))
        self._record(
            "memset",
            "memset",
            label,
            {"dst": ptr, "value": 0, "count": count},
            site,
            lambda: self.backend.memset_zero(ptr, count),
        )

    def upload(self, label: str, dst: int, values: np.ndarray, stride: int = 1) -> None:
        """A host-to-device write (batch, forced gate, injected values): a recorded launch too."""
        values = np.asarray(values)
        count = int(values.size)
        site = None
        if self.instrumented:
            key = ("upload", dst, count, stride)
            site = self._sites.get(key)
            if site is None:
                site = self._site(key, (self._bind("dst", dst, "w", (0, count, 1, stride)),))
        self._record(
            "copy",
            "upload",
            label,
            {"dst": dst, "count": count, "stride": stride},
            site,
            lambda: self.backend.upload(dst, values, stride),
        )

    def checkpoint(self, name: str, buffers: list[str] | tuple[str, ...], **meta: Any) -> None:
        if not self.instrumented:
            return
        self._trace.launches.append(
            Launch(len(self._trace.launches), self.step, "checkpoint", name, name, dict(meta))
        )
        self._trace.snapshots[(self.step, name)] = self._snapshot(buffers)

    def _snapshot(self, buffers: list[str] | tuple[str, ...]) -> Snapshot:
        ptrs = [self.amap.bases[b] for b in buffers]
        copies = self.watcher.timed(cost_kinds.SNAPSHOTS, lambda: self.backend.snapshot(ptrs))
        on_device = getattr(self.backend, "device_view", None)  # the CUDA backend's
        return Snapshot(dict(zip(buffers, copies, strict=True)), self.backend.to_host, on_device)

    def read(self, buffer: str) -> np.ndarray:
        """A host copy of one named buffer."""
        return self.backend.read(self.amap.bases[buffer])
