"""The trainer's kernels for `egf-audit capture --cpu`: each `.cu` source of `--kernels DIR`, the
recorder's own kernels and every NVRTC program the trainer compiles, built for the CPU behind
the shim the CPU backend uses (kernels/cpu_shim.h), by the CPU backend's own compile rules and
cache (runtime/backends/cpu_build.py: same flags, same cache that cannot lie).

Every `__global__` function of a source is a kernel the fake libcuda can launch, by its symbol
(the compiled library names it: extern "C" or C++-mangled) or by its identifier. Its parameters
are read by the types of its own signature (cpu/egf_cpu_launch.h). A kernel that needs what the
shim does not model (shared memory, barriers, warp intrinsics: runtime/kernel_sources.py's
UNSUPPORTED) is refused by name, with the construct and its line, and so is every kernel of a
source whose other code needs one, a template kernel, an overloaded name, and every kernel of a
source the host compiler refuses: a launch of one is refused (exit 2), never run.

What was built is written as a module index (its format: cpu/driver_kernels.c). The fake NVRTC
runs this module (`python -m egf_audit.capture.cpu_kernels`) once per process and sends it each
program on stdin:

    name NAME\\n  header NAME BYTES\\n<bytes>  ...  source BYTES\\n<bytes>  end\\n

(and `define NAME[=VALUE]`, `include DIR` lines for its -D and -I options), and hands the
index it prints to the trainer as the program's "PTX".
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import SHIM_HEADER, bundled_dir
from egf_audit.runtime.backends.cpu_build import KernelCompileError, build_library
from egf_audit.runtime.kernel_sources import first_unsupported, headers_under, strip_comments

CPU_FOLDER = Path(__file__).with_name("cpu")
LAUNCH_HEADER = "egf_cpu_launch.h"
RECORDER_KERNELS = Path(__file__).with_name("egf_recorder_kernels.cu")
INDEX_MAGIC = "egf-audit-cpu-module/1"
# a library's references to its own symbols bind inside it: a kernel named as the trainer's host
# stub of it (`addone`, `_Z6addonePfi`) must never call that stub
LINK_FLAGS = ("-Wl,-Bsymbolic",)

_GLOBAL = re.compile(r"\b__global__\b")
_SIGNATURE = re.compile(
    r"\s*(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    r"([A-Za-z_]\w*)\s*\("
)


@dataclass(frozen=True)
class Kernel:
    name: str  # its identifier
    qualified: str  # as the launcher names it (namespaces)
    line: int
    body: tuple[int, int]  # the braces' offsets in the comment-stripped text, or (0, 0)
    why: str | None = None  # refused


def _matching(code: str, at: int, open_: str, close: str) -> int:
    """The offset just past the bracket closing the one at `at` (-1: unbalanced)."""
    depth = 0
    for i in range(at, len(code)):
        if code[i] == open_:
            depth += 1
        elif code[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _namespaces(code: str, at: int) -> list[str]:
    """The named namespaces open at offset `at`."""
    stack: list[tuple[str, int]] = []
    depth = 0
    pending: str | None = None
    for match in re.finditer(r"\bnamespace\s+([A-Za-z_]\w*)?\s*\{|[{}]", code[:at]):
        token = match.group(0)
        if token.startswith("namespace"):
            pending = match.group(1) or ""
            depth += 1
            stack.append((pending, depth))
        elif token == "{":
            depth += 1
        else:
            if stack and stack[-1][1] == depth:
                stack.pop()
            depth -= 1
    return [name for name, _ in stack if name]


def _is_template(code: str, at: int) -> bool:
    start = max(code.rfind(";", 0, at), code.rfind("}", 0, at), code.rfind("{", 0, at)) + 1
    return re.search(r"\btemplate\s*<", code[start:at]) is not None


def find_kernels(code: str) -> list[Kernel]:
    """Every `__global__` function defined in a comment-stripped source."""
    found: list[Kernel] = []
    for match in _GLOBAL.finditer(code):
        sig = _SIGNATURE.match(code, match.end())
        if sig is None:
            continue
        params_end = _matching(code, sig.end() - 1, "(", ")")
        rest = code[params_end:] if params_end > 0 else ""
        brace = re.match(r"\s*\{", rest)
        if params_end < 0 or brace is None:
            continue  # a declaration, defined elsewhere
        start = params_end + brace.end() - 1
        end = _matching(code, start, "{", "}")
        name = sig.group(1)
        qualified = "::".join([*_namespaces(code, match.start()), name])
        line = code.count("\n", 0, match.start()) + 1
        why = None
        if _is_template(code, match.start()):
            why = "a template kernel (--cpu compiles no instantiation of it)"
        if end < 0:
            why = "its body is not balanced"
            end = start
        found.append(Kernel(name, qualified, line, (start, end), why))
    names = [k.name for k in found]
    return [
        k if k.why or names.count(k.name) == 1 else replace(k, why="an overloaded kernel name")
        for k in found
    ]


# CUDA headers that declare nothing a kernel compiled behind the shim needs (the shim defines
# __global__, threadIdx, ...): their #include lines are dropped, line numbers kept
_HOST_HEADERS = re.compile(
    r"^[ \t]*#[ \t]*include[ \t]*[<\"](?:cuda_runtime|cuda_runtime_api|cuda"
    r"|device_launch_parameters|cuda_device_runtime_api)\.h[>\"][^\n]*$",
    re.M,
)


def _blank(text: str) -> str:
    """`text` with every character but newlines made a space (line numbers kept)."""
    return re.sub(r"[^\n]", " ", text)


@dataclass(frozen=True)
class Built:
    library: Path | None
    kernels: tuple[Kernel, ...]

    def index_lines(self) -> list[str]:
        lines = [f"library {self.library}"] if self.library else []
        for i, k in enumerate(self.kernels):
            lines.append(f"refused {k.name} {k.why}" if k.why else f"kernel {i} {k.name}")
        return lines


def _judged(code: str, display: str) -> list[Kernel]:
    """The kernels of a source, each refused where the shim cannot run it faithfully."""
    kernels = find_kernels(code)
    outside = code
    for k in kernels:
        a, b = k.body
        outside = outside[:a] + _blank(outside[a:b]) + outside[b:]
    elsewhere = first_unsupported(outside)
    judged = []
    for k in kernels:
        a, b = k.body
        inside = first_unsupported(code[a:b], code.count("\n", 0, a) + 1)
        found = inside or elsewhere
        if k.why is None and found is not None:
            line, token, what = found
            where = "its body" if inside else "the code beside it"
            k = replace(k, why=f"{where} uses `{token}` ({what}) at {display}:{line}")
        judged.append(k)
    return judged


def build_source(
    text: str, display: str, headers: dict[str, str], judge: bool = True, prelude: str = ""
) -> Built:
    """One source compiled for the CPU (from the cache when built before), its kernels judged
    (`judge=False` for egf-audit's own, whose CPU branch its tests prove); `prelude` comes
    before it (an NVRTC program's -D options)."""
    code = strip_comments(text)
    kernels = _judged(code, display) if judge else find_kernels(code)
    runnable = [k for k in kernels if not k.why]
    if not runnable:
        return Built(None, tuple(kernels))
    body = text
    # the refused kernels' bodies blanked (their signatures kept, so the rest still compiles)
    for k in sorted((k for k in kernels if k.why), key=lambda k: -k.body[0]):
        a, b = k.body
        body = body[:a] + "{" + _blank(body[a + 1 : b - 1]) + "}" + body[b:]
    body = _HOST_HEADERS.sub("", body.removeprefix("\ufeff"))
    launchers = "\n".join(
        f"EGF_CPU_KERNEL({i}, {k.qualified})" for i, k in enumerate(kernels) if not k.why
    )
    unit = (
        f'#define EGF_CPU_THREAD_LOCAL\n#include "{SHIM_HEADER}"\n#include "{LAUNCH_HEADER}"\n'
        f"{prelude}"
        f'#line 1 "{display}"\n{body}\n'
        f'#line 1 "egf-audit-cpu-launcher.cpp"\n{launchers}\n'
    )
    shim = (bundled_dir() / SHIM_HEADER).read_text(encoding="utf-8")
    launch = (CPU_FOLDER / LAUNCH_HEADER).read_text(encoding="utf-8")
    every = {**headers, SHIM_HEADER: shim, LAUNCH_HEADER: launch}
    name = re.sub(r"\W", "_", Path(display).stem) or "program"
    try:
        library = build_library(f"capture-{name}", unit, every, display, LINK_FLAGS)
    except KernelCompileError as exc:
        why = f"its source does not compile for the CPU ({exc})"
        return Built(None, tuple(replace(k, why=k.why or why) for k in kernels))
    return Built(library, tuple(kernels))


def module_index(built: list[Built]) -> str:
    lines = [INDEX_MAGIC]
    for b in built:
        lines += b.index_lines()
    return "\n".join(lines) + "\n"


def kernels_dir_index(kernels_dir: Path | None) -> str:
    """The index of every `.cu` source under `kernels_dir` and the recorder's own kernels."""
    own = RECORDER_KERNELS.read_text(encoding="utf-8")
    built = [build_source(own, str(RECORDER_KERNELS), {}, judge=False)]
    if kernels_dir is not None:
        headers = dict(headers_under(kernels_dir))

        def build(path: Path) -> Built:
            text = path.read_bytes().decode("utf-8", errors="replace")
            return build_source(text, str(path), headers)

        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            built += list(pool.map(build, sorted(kernels_dir.rglob("*.cu"))))
    return module_index(built)


# ---- the fake NVRTC's compiler ----
@dataclass
class Program:
    name: str = "program.cu"
    source: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    defines: list[str] = field(default_factory=list)  # -D NAME[=VALUE]


def read_program(stream: BinaryIO) -> Program | None:
    """One request of the fake NVRTC (this module's docstring), up to its `end` line; None at
    the end of the stream."""
    program = Program()
    included: dict[str, str] = {}
    while line := stream.readline():
        word, _, rest = line.decode().rstrip("\n").partition(" ")
        if word == "end":
            break
        if word == "name":
            program.name = rest or program.name
        elif word == "define":
            program.defines.append(rest)
        elif word == "include" and Path(rest).is_dir():
            included |= dict(headers_under(Path(rest)))
        elif word == "header":
            hname, _, count = rest.rpartition(" ")
            program.headers[hname] = stream.read(int(count)).decode("utf-8", errors="replace")
        elif word == "source":
            program.source = stream.read(int(rest)).decode("utf-8", errors="replace")
    else:
        return None
    program.headers = {**included, **program.headers}  # the program's own win
    return program


def compile_program(program: Program) -> str:
    """An NVRTC program's module index."""
    prelude = "".join(
        f"#define {name} {value or 1}\n"
        for name, _, value in (d.partition("=") for d in program.defines)
    )
    return module_index(
        [build_source(program.source, program.name, program.headers, prelude=prelude)]
    )


def main() -> int:
    """Answer the fake NVRTC's requests, one after another, until it closes the stream: "ok
    BYTES" and the module index, or "error BYTES" and why (the cache could not be used)."""
    out = sys.stdout.buffer
    while (program := read_program(sys.stdin.buffer)) is not None:
        try:
            status, text = "ok", compile_program(program)
        except AuditEnvironmentError as exc:
            status, text = "error", str(exc)
        data = text.encode()
        out.write(f"{status} {len(data)}\n".encode() + data)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
