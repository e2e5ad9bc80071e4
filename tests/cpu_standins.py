"""The C++ stand-ins of tests/data/capture built for `egf-audit capture --cpu` on this machine,
each once, and cached by a hash of everything it is built from (a build is renamed into place
whole, so a half-built one is never read).

They are linked the way a trainer repository's build links them on a runner with the CUDA
toolkit but no GPU and no cuBLAS: nvcc's own libcudart.so (`-cudart shared`; nvcc's default
static runtime for the `-static` builds, which --cpu refuses), and cuBLAS, cuBLASLt, libcuda and
NVRTC from egf-audit's CPU libraries (the toolkit here ships none of them). At run time `capture
--cpu` puts its libraries first for the loader, as it does for any trainer.

    plans           make_plan.py's plans at small.toml's dims: clean and the 12 faults
    plans-ci        the clean plan at the ci preset (the benchmark's)
    trainer         runtime/trainer.cu, extern "C" kernels, <<<>>> launches
    trainer-cxx     the same with C++-named (mangled) kernels (and their sources, kernels-cxx/)
    trainer-driver  runtime/trainer_driver.cpp: the driver API, every kernel through NVRTC
    gemm_probe      runtime/gemm_probe.cu: every GEMM entry point, no SP14 trainer
    cpu_probe       cpu/cpu_probe.cu: what --cpu runs, refuses and stops (and the PTX of its
                    kernels, probe_kernels.ptx)
    cpu_probe-static  the same with nvcc's static runtime
    outsider        outsider/: the SP14 trainer written from the docs alone (driver API,
                    NVRTC, cuBLAS; its kernels are read at run time: pass --kernels)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from test_capture_runtime import RECORDINGS

from egf_audit.capture.build import build_recorder
from egf_audit.capture.cpu_libraries import build_cpu_libraries
from egf_audit.runtime.build_cache import cache_dir

DATA = Path(__file__).parent / "data" / "capture"
RUNTIME = DATA / "runtime"
CPU = DATA / "cpu"
OUTSIDER = DATA / "outsider"
KERNELS = Path(__file__).resolve().parents[1] / "kernels"
# the capture-visible faults whose H200 recordings the stand-ins are held to
FAULTS = tuple(name for name in RECORDINGS if name != "clean")
# -O0: the host code of a stand-in runs for a second; g++ optimising it cost 30 % of each build
# (the outsider: 4.4 -> 3.2 s), and device code is PTX that --cpu never runs (it compiles the
# kernels' sources for the CPU)
HOST_OPT = "-O0"
NVCC_FLAGS = [HOST_OPT, "-std=c++17", "-arch=compute_75", "-code=compute_75"]
MAKE_PLAN = [sys.executable, str(RUNTIME / "make_plan.py")]
TRAINER = RUNTIME / "trainer.cu"
RUNTIME_SOURCES = [TRAINER, RUNTIME / "plan_runner.h", RUNTIME / "cublas_decls.h"]


def _run(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ...: {proc.stderr[-2000:]}")


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    return nvcc


def _link(libraries: Path) -> list[str]:
    return [
        f"-L{libraries}",
        "-l:libcublas.so.13",
        "-l:libcublasLt.so.13",
        "-Xlinker",
        f"-rpath-link={libraries}",
    ]


def _kernels_cxx(work: Path) -> Path:
    """kernels/*.cu with C++ names: `extern "C" ` taken out."""
    cxx = work / "kernels-cxx"
    cxx.mkdir()
    for source in KERNELS.glob("*.cu"):
        (cxx / source.name).write_text(source.read_text().replace('extern "C" ', ""))
    return cxx


def _trainer(work: Path, libraries: Path, kernels: Path, out: str, runtime: list[str]) -> None:
    _run([*MAKE_PLAN, str(work), "--dispatch"])  # dispatch.inc: one <<<>>> per kernel
    _run([_nvcc(), *NVCC_FLAGS, *runtime, "-I", str(kernels), "-I", str(work), str(TRAINER),
          "-o", str(work / out), *_link(libraries)])  # fmt: skip


def _plans(work: Path, _: Path) -> None:
    faults = [w for f in ("clean", *FAULTS) for w in ("--fault", f)]
    _run([*MAKE_PLAN, str(work), "--config", str(RUNTIME / "small.toml"), *faults])


def _program(source: Path, out: str, runtime: list[str], more: tuple[str, ...] = ()) -> Callable:
    def build(work: Path, libraries: Path) -> None:
        _run([_nvcc(), *NVCC_FLAGS, *runtime, str(source), "-o", str(work / out),
              *_link(libraries), *more])  # fmt: skip

    return build


def _cpu_probe(out: str, runtime: list[str]) -> Callable:
    """cpu_probe, and the PTX of its kernels (for `cpu_probe ptx PATH`)."""
    program = _program(CPU / "cpu_probe.cu", out, runtime, ("-l:libcuda.so.1",))

    def build(work: Path, libraries: Path) -> None:
        program(work, libraries)
        _run([_nvcc(), "-ptx", "-arch=compute_75", str(CPU / "kernels" / "probe_kernels.cu"),
              "-o", str(work / "probe_kernels.ptx")])  # fmt: skip

    return build


def _driver(work: Path, libraries: Path) -> None:
    _run([_nvcc(), HOST_OPT, "-std=c++17", "-x", "c++", "-I", str(RUNTIME),
          str(RUNTIME / "trainer_driver.cpp"), "-o", str(work / "trainer-driver"),
          *_link(libraries), "-l:libcuda.so.1", "-l:libnvrtc.so.13"])  # fmt: skip


def _outsider(work: Path, libraries: Path) -> None:
    _run([_nvcc(), HOST_OPT, "-std=c++17", "-cudart", "shared", str(OUTSIDER / "trainer.cu"),
          str(OUTSIDER / "gpu_cuda.cpp"), "-o", str(work / "outsider"), *_link(libraries),
          "-l:libcuda.so.1", "-l:libnvrtc.so.13"])  # fmt: skip


SHARED = ["-cudart", "shared"]
# artifact -> (the files it is built from, how)
ARTIFACTS: dict[str, tuple[list[Path], Callable[[Path, Path], None]]] = {
    "plans": ([RUNTIME / "make_plan.py", RUNTIME / "small.toml", *KERNELS.glob("*.cu")], _plans),
    "plans-ci": (
        [RUNTIME / "make_plan.py", *KERNELS.glob("*.cu")],
        lambda work, _: _run([*MAKE_PLAN, str(work)]),
    ),
    "trainer": (
        [*RUNTIME_SOURCES, *KERNELS.glob("*.cu")],
        lambda work, libs: _trainer(work, libs, KERNELS, "trainer", SHARED),
    ),
    "trainer-cxx": (
        [*RUNTIME_SOURCES, *KERNELS.glob("*.cu")],
        lambda work, libs: _trainer(work, libs, _kernels_cxx(work), "trainer-cxx", SHARED),
    ),
    "trainer-driver": (
        [RUNTIME / "trainer_driver.cpp", RUNTIME / "plan_runner.h", RUNTIME / "cublas_decls.h"],
        _driver,
    ),
    "outsider": (
        [
            OUTSIDER / name
            for name in ("trainer.cu", "gpu_cuda.cpp", "gpu.h", "net.h", "reference.h")
        ],
        _outsider,
    ),
    "gemm_probe": (
        [RUNTIME / "gemm_probe.cu", RUNTIME / "cublas_decls.h"],
        _program(RUNTIME / "gemm_probe.cu", "gemm_probe", SHARED),
    ),
    "cpu_probe": (
        [*CPU.rglob("*.cu"), RUNTIME / "cublas_decls.h"],
        _cpu_probe("cpu_probe", SHARED),
    ),
    "cpu_probe-static": (
        [*CPU.rglob("*.cu"), RUNTIME / "cublas_decls.h"],
        _cpu_probe("cpu_probe-static", []),
    ),
}


def _key(name: str, libraries: Path) -> str:
    version = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256(f"{name}\0{version}\0{libraries}".encode())
    inputs, _ = ARTIFACTS[name]
    for path in [*sorted(set(inputs)), Path(__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def libraries() -> Path:
    """egf-audit's CPU libraries, as `capture --cpu` builds them."""
    return build_cpu_libraries(build_recorder())


def artifact(name: str) -> Path:
    """The folder holding one built artifact (ARTIFACTS), built now unless cached."""
    libs = libraries()
    root = cache_dir("test-cpu-standins")
    folder = root / f"{name}-{_key(name, libs)}"
    if (folder / "done").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        work = Path(tmp) / name
        work.mkdir()
        ARTIFACTS[name][1](work, libs)
        (work / "done").write_text("")
        try:
            os.rename(work, folder)
        except OSError:
            if not (folder / "done").exists():
                raise
    return folder


def plan(plans: Path, name: str, layout: Path) -> list[str]:
    """A trainer's arguments for plan `name` (clean or a fault), writing its layout to `layout`."""
    return [str(plans / f"{name}.plan"), str(plans / f"{name}.layout"), "--layout-out", str(layout)]
