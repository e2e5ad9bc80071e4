"""Build the CUDA libraries `egf-audit capture --cpu` puts in front of the trainer: egf-audit's
own libcuda.so.1, libcupti, libcudart, libcublas, libcublasLt and libnvrtc for the CPU (C
sources in `capture/cpu/`), compiled with the host C compiler against the toolkit's headers on
first use and cached, as the recorder is, by a hash of the sources, the generated stubs, the
flags, the compiler and the toolkit.

Every entry point of cuda.h and cuda_runtime_api.h these sources do not implement gets a stub
generated from the header: it refuses the call by name (egf_cpu_refuse: one line on stderr,
one in the refusals file) and returns CUDA_ERROR_NOT_SUPPORTED (cudaErrorNotSupported), so a
trainer that reaches for CUDA graphs, textures or peer copies is refused, naming the call,
never run wrongly. cuBLAS, cuBLASLt and NVRTC have no header on most machines: their stubs come
from the list in `cpu/unmodeled.txt`.

Each library carries its soname and, where NVIDIA's does, a version node of that name
(`cudaMalloc@libcudart.so.13`), so a program linked against NVIDIA's libraries loads these.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.build_cache import cache_dir

from .build import Toolkit, find_toolkit
from .build import _compiler as c_compiler
from .build import _compiler_id as c_compiler_id

SOURCES = Path(__file__).with_name("cpu")
CACHE_KIND = "capture-cpu"  # the cache's folder for these builds (runtime/build_cache.py)
C_FLAGS = ["-O2", "-fPIC", "-Wall", "-fno-optimize-sibling-calls", "-fno-strict-aliasing"]
MAJORS = ("13", "12")  # the sonames of CUDA 13's and CUDA 12's libraries, one build each

# Why a family of calls is not modeled, by prefix (the stubs' reason)
UNMODELED = (
    ("cuGraph", "CUDA graphs"),
    ("cudaGraph", "CUDA graphs"),
    ("cuStreamBeginCapture", "stream capture into a CUDA graph"),
    ("cudaStreamBeginCapture", "stream capture into a CUDA graph"),
    ("cuStreamEndCapture", "stream capture into a CUDA graph"),
    ("cudaStreamEndCapture", "stream capture into a CUDA graph"),
    ("cuTex", "textures"),
    ("cudaCreateTextureObject", "textures"),
    ("cuSurf", "surfaces"),
    ("cudaCreateSurfaceObject", "surfaces"),
    ("cuArray", "CUDA arrays"),
    ("cudaMallocArray", "CUDA arrays"),
    ("cudaMalloc3DArray", "CUDA arrays"),
    ("cuMipmappedArray", "CUDA arrays"),
    ("cuMemcpyPeer", "peer copies between devices"),
    ("cudaMemcpyPeer", "peer copies between devices"),
    ("cuCtxEnablePeerAccess", "peer access between devices"),
    ("cudaDeviceEnablePeerAccess", "peer access between devices"),
    ("cuDeviceCanAccessPeer", "peer access between devices"),
    ("cudaDeviceCanAccessPeer", "peer access between devices"),
    ("cuMemAllocManaged", "managed memory"),
    ("cudaMallocManaged", "managed memory"),
    ("cuMemPrefetch", "managed memory"),
    ("cudaMemPrefetch", "managed memory"),
    ("cuMemAdvise", "managed memory"),
    ("cudaMemAdvise", "managed memory"),
    ("cuIpc", "CUDA IPC"),
    ("cudaIpc", "CUDA IPC"),
    ("cuGraphics", "graphics interop"),
    ("cudaGraphics", "graphics interop"),
    ("cuMemPool", "memory pools"),
    ("cudaMemPool", "memory pools"),
    ("cuMemCreate", "virtual memory management"),
    ("cuMemMap", "virtual memory management"),
    ("cuMemAddressReserve", "virtual memory management"),
    ("cuLink", "run-time linking"),
)


@dataclass(frozen=True)
class Library:
    soname: str
    sources: tuple[str, ...]  # in SOURCES
    stubs: str | None = None  # the generated stubs' file name, if any
    versioned: bool = True  # a version node named by the soname
    needs_cuda: bool = True  # links against the fake libcuda.so.1
    needs: tuple[str, ...] = ()  # the other fakes it links against (built before it)


def _libraries(cupti_soname: str) -> list[Library]:
    libs = [
        Library(
            "libcuda.so.1",
            (
                "driver_core.c",
                "driver_memory.c",
                "driver_kernels.c",
                "driver_api.c",
                "driver_memory_api.c",
                "driver_launch_api.c",
            ),
            "driver_stubs.c",
            versioned=False,
            needs_cuda=False,
        ),
        Library(cupti_soname, ("cupti.c",)),
    ]
    for major in MAJORS:
        lt = f"libcublasLt.so.{major}"
        libs += [
            Library(f"libcudart.so.{major}", ("cudart_core.c", "cudart_api.c"), "cudart_stubs.c"),
            Library(lt, ("cublaslt.c", "gemm.c"), "cublasLt"),
            Library(
                f"libcublas.so.{major}",
                ("cublas.c", "cublas_log.c", "gemm.c"),
                "cublas",
                needs=(lt,),
            ),
            Library(f"libnvrtc.so.{major}", ("nvrtc.c",), "nvrtc"),
        ]
    return libs


# ---- stubs from the headers ----
@lru_cache(maxsize=8)
def _declared(
    cc: str, toolkit: Toolkit, header: str, result: str, defines: tuple[str, ...]
) -> set[str]:
    """The entry points a toolkit header declares returning `result`, read from the
    preprocessor's output (so versioned and per-thread names are the symbols' own)."""
    found: set[str] = set()
    includes = [f"-I{i}" for i in toolkit.include]
    for define in ([], *[[d] for d in defines]):
        proc = subprocess.run(
            [cc, "-E", "-P", *includes, *define, "-x", "c", "-"],
            input=f"#include <{header}>\n",
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise AuditEnvironmentError(
                f"capture --cpu reads {header} from the CUDA toolkit: it does not preprocess "
                f"({proc.stderr.strip().splitlines()[:1]})"
            )
        found |= set(re.findall(rf"\b{result}\s+(?:CUDA\w*API\s+)?(cu\w+)\s*\(", proc.stdout))
    return found


def _implemented(sources: tuple[str, ...], result: str) -> set[str]:
    names: set[str] = set()
    for source in sources:
        text = (SOURCES / source).read_text(encoding="utf-8")
        names |= set(re.findall(rf"^{result}\s+CUDA\w*API\s+(\w+)\(", text, re.M))
    return names


def _reason(name: str) -> str:
    for prefix, what in UNMODELED:
        if name.startswith(prefix):
            return f"{what}: egf-audit capture --cpu does not model them"
    return "egf-audit capture --cpu does not model this call"


def stubs_source(names: list[str]) -> str:
    """One C function per name: refuses the call by name, returns 801 (not supported)."""
    lines = [
        "/* generated by egf_audit.capture.cpu_libraries: calls --cpu does not model */",
        "extern void egf_cpu_refuse(const char *name, const char *why);",
    ]
    for name in sorted(names):
        reason = _reason(name).replace('"', "'")
        lines.append(
            f'__attribute__((visibility("default"))) int {name}(void) '
            f'{{ egf_cpu_refuse("{name}", "{reason}"); return 801; }}'
        )
    return "\n".join(lines) + "\n"


def expand(pattern: str) -> list[str]:
    """`cublas{S,D}dot_v2` -> cublasSdot_v2, cublasDdot_v2 (braces nest one after another)."""
    found = re.search(r"\{([^{}]*)\}", pattern)
    if found is None:
        return [pattern]
    head, tail = pattern[: found.start()], pattern[found.end() :]
    return [name for part in found.group(1).split(",") for name in expand(head + part + tail)]


def _unmodeled_list(family: str) -> list[str]:
    """The names of `cpu/unmodeled.txt` under `[family]`."""
    names: list[str] = []
    current = None
    for line in (SOURCES / "unmodeled.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif line and current == family:
            names += expand(line)
    return names


def _stubs(cc: str, toolkit: Toolkit, lib: Library) -> str:
    if lib.stubs == "driver_stubs.c":
        declared = _declared(cc, toolkit, "cuda.h", "CUresult", ("-D__CUDA_API_VERSION_INTERNAL",))
        return stubs_source(sorted(declared - _implemented(lib.sources, "CUresult")))
    if lib.stubs == "cudart_stubs.c":
        declared = _declared(
            cc,
            toolkit,
            "cuda_runtime_api.h",
            "cudaError_t",
            ("-DCUDA_API_PER_THREAD_DEFAULT_STREAM",),
        )
        return stubs_source(sorted(declared - _implemented(lib.sources, "cudaError_t")))
    implemented: set[str] = set()
    for source in lib.sources:
        text = (SOURCES / source).read_text(encoding="utf-8")
        implemented |= set(re.findall(r"^EXPORT\s+[\w\s*]+?\b(\w+)\(", text, re.M))
    return stubs_source([n for n in _unmodeled_list(lib.stubs or "") if n not in implemented])


# ---- the cupti soname the recorder was linked against ----
def _elf_strings(path: Path, tag: int) -> list[str]:
    """The dynamic section's strings of `tag` (1 DT_NEEDED, 14 DT_SONAME) of a 64-bit ELF."""
    import struct

    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return []
    shoff, shentsize, shnum = (
        struct.unpack_from("<Q", data, 0x28)[0],
        struct.unpack_from("<H", data, 0x3A)[0],
        struct.unpack_from("<H", data, 0x3C)[0],
    )
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[link][4]
        out = []
        for at in range(offset, offset + size, entsize or 16):
            d_tag, d_val = struct.unpack_from("<qQ", data, at)
            if d_tag == tag:
                end = data.index(b"\0", strtab + d_val)
                out.append(data[strtab + d_val : end].decode())
        return out
    return []


def cupti_soname(recorder: Path) -> str:
    """The libcupti soname the recorder needs: the fake libcupti is built under it."""
    for name in _elf_strings(recorder, 1):
        if name.startswith("libcupti.so"):
            return name
    raise AuditEnvironmentError(f"the capture recorder {recorder} links no libcupti")


# ---- the build ----
def _link_flags(lib: Library, folder: Path) -> list[str]:
    flags = ["-shared", f"-Wl,-soname,{lib.soname}", "-Wl,-rpath,$ORIGIN", "-ldl", "-lpthread"]
    flags.append("-lrt")  # timer_create, in libc itself from glibc 2.34
    if lib.versioned:
        script = folder / f"{lib.soname}.map"
        script.write_text(f"{lib.soname} {{ global: *; }};\n", encoding="ascii")
        flags.append(f"-Wl,--version-script={script}")
    if lib.needs_cuda:
        flags += [f"-L{folder}", *[f"-l:{n}" for n in lib.needs], "-l:libcuda.so.1"]
    return flags


def _compile(cc: str, toolkit: Toolkit, lib: Library, folder: Path, stubs: str | None) -> None:
    units = [str(SOURCES / s) for s in lib.sources]
    if stubs is not None:
        unit = folder / f"{lib.soname}.stubs.c"
        unit.write_text(stubs, encoding="utf-8")
        units.append(str(unit))
    includes = [f"-I{SOURCES}", *[f"-I{i}" for i in toolkit.include]]
    command = [cc, *C_FLAGS, *includes, "-o", str(folder / lib.soname), *units]
    proc = subprocess.run(
        [*command, *_link_flags(lib, folder)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        errors = [ln for ln in proc.stderr.splitlines() if "error" in ln] or [proc.stderr]
        raise AuditEnvironmentError(
            f"capture --cpu: {lib.soname} does not compile: {' | '.join(errors[:4]).strip()}"
        )


def _links(folder: Path) -> None:
    """The unversioned names a program or a binding may dlopen (libcuda.so, libnvrtc.so)."""
    for built in list(folder.glob("lib*.so.*")):
        if built.suffix == ".map" or ".stubs" in built.name:
            continue
        plain = folder / built.name.split(".so")[0]
        link = plain.with_name(plain.name + ".so")
        if not link.exists():
            link.symlink_to(built.name)


def _header(toolkit: Toolkit, name: str) -> bytes:
    for folder in toolkit.include:
        if (folder / name).exists():
            return (folder / name).read_bytes()
    raise AuditEnvironmentError(f"capture --cpu needs the CUDA toolkit's {name}: not found")


def build_cpu_libraries(recorder: Path) -> Path:
    """The folder holding the fake libraries (and their unversioned names), built once per
    distinct (sources, toolkit headers, flags, compiler, cupti soname); the stubs are generated
    from the headers only when it is built."""
    toolkit = find_toolkit()
    cc = c_compiler()
    libs = _libraries(cupti_soname(recorder))
    digest = hashlib.sha256(f"{c_compiler_id(cc)}\0{C_FLAGS}\0{toolkit.include}".encode())
    for header in ("cuda.h", "cuda_runtime_api.h"):
        digest.update(_header(toolkit, header))
    for path in sorted(SOURCES.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr(libs).encode() + Path(__file__).read_bytes())
    key = digest.hexdigest()[:24]
    root = cache_dir(CACHE_KIND)
    folder = root / key
    if (folder / "libcuda.so.1").exists():
        return folder
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
            work = Path(tmp) / "libs"
            work.mkdir()

            def build(lib: Library) -> None:
                _compile(cc, toolkit, lib, work, _stubs(cc, toolkit, lib) if lib.stubs else None)

            build(libs[0])  # libcuda.so.1 first: the others link against it
            later = [lib for lib in libs[1:] if not lib.needs]
            with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
                list(pool.map(build, later))
                list(pool.map(build, [lib for lib in libs[1:] if lib.needs]))
            for scratch in [*work.glob("*.map"), *work.glob("*.stubs.c")]:
                scratch.unlink()
            _links(work)
            try:
                os.rename(work, folder)  # atomic: a concurrent build sees all of it or none
            except OSError:
                if not (folder / "libcuda.so.1").exists():
                    raise
    except OSError as exc:
        raise AuditEnvironmentError(
            f"capture --cpu cannot use the cache {root}: {exc.strerror or exc}"
        ) from None
    return folder
