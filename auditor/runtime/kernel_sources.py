"""Which kernel sources a run audits: the bundled ones, a trainer's own (`--kernels DIR`), and the
source patches of kernel faults. Every source is checked before any backend compiles it: its
`extern "C"` entry point must match the ABI signature, and it must be plain per-thread code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError, option_error
from egf_audit.kernels import KERNELS, KERNELS_BY_FILE, KernelSpec, bundled_source

# Constructs the CPU backend cannot run faithfully (it runs one thread at a time).
UNSUPPORTED = {
    "__syncthreads": "block-wide barrier",
    "__syncwarp": "warp barrier",
    "__shared__": "shared memory",
    "__shfl": "warp shuffle",
    "__ballot": "warp vote",
    "__any_sync": "warp vote",
    "__all_sync": "warp vote",
    "__activemask": "warp intrinsic",
    "__threadfence": "memory fence",
    "cooperative_groups": "cooperative groups",
    "warpSize": "warp size",
    "asm(": "inline PTX",
    "asm volatile": "inline PTX",
    "atomicCAS": "compare-and-swap atomics",
    "atomicExch": "exchange atomics",
}


HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".inc", ".inl")


def headers_under(root: Path) -> tuple[tuple[str, str], ...]:
    """Every header under a --kernels folder, read once: what the CPU build compiles (from a
    copy) and hashes into its cache key, so an edited header rebuilds the kernel."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix in HEADER_SUFFIXES and path.is_file():
            try:
                # bytes as written (CRLF kept), like the sources: the document hashes them
                text = path.read_bytes().decode("utf-8")
                found.append((path.relative_to(root).as_posix(), text))
            except (OSError, UnicodeDecodeError) as exc:
                raise AuditEnvironmentError(f"{path}: cannot be read: {exc}") from None
    return tuple(found)


@dataclass(frozen=True)
class KernelSource:
    spec: KernelSpec
    text: str
    origin: str  # "bundled", "kernels-dir" or "fault:<name>"
    path: str  # shown in the document: "egf-audit:kernels/<file>" or the file's path under DIR
    include_dir: str | None = None  # searched for `#include "..."` (a --kernels DIR), as nvcc -I
    # every header under include_dir when the source was read: (relative path, text)
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def code(self) -> str:
        """The text as a compiler is handed it: no byte-order mark (nvcc and g++ skip one at the
        start of a file, but the backends put a `#line` directive before the text)."""
        return self.text.removeprefix("\ufeff")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def strip_comments(text: str) -> str:
    """Comments blanked out, line structure kept, so line numbers stay right."""

    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    return re.sub(r"//[^\n]*|/\*.*?\*/", blank, text, flags=re.S)


def first_unsupported(code: str, first_line: int = 1) -> tuple[int, str, str] | None:
    """(line, token, what) of the first construct the CPU cannot run faithfully in `code`
    (comments stripped), counting lines from `first_line`; None when it is plain per-thread
    code."""
    for lineno, line in enumerate(code.splitlines(), start=first_line):
        for token, what in UNSUPPORTED.items():
            if token in line:
                return lineno, token, what
    return None


def _normalise_type(t: str) -> str:
    t = re.sub(r"\b(__restrict__|__restrict|restrict)\b", "", t)
    t = re.sub(r"\bfloat\s+const\b", "const float", t)
    t = re.sub(r"\bint\s+const\b", "const int", t)
    t = re.sub(r"\bsigned\b\s*", "", t)
    t = re.sub(r"\blong\s+long\s+int\b", "long long", t)
    t = re.sub(r"\s*\*\s*", "*", t)
    t = re.sub(r"\*const\b", "*", t)
    return re.sub(r"\s+", " ", t).strip()


def _param_type(decl: str) -> str:
    decl = decl.strip()
    m = re.match(r"(.*?[\s\*])([A-Za-z_]\w*)\s*$", decl)
    return _normalise_type(m.group(1) if m else decl)


# `__global__ void NAME(`, with `__launch_bounds__(...)` allowed before or after `void`
_BOUNDS = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
_GLOBAL = r"__global__\s+" + _BOUNDS + r"void\s+" + _BOUNDS


def _definition(code: str, name: str) -> re.Match | None:
    return re.search(_GLOBAL + re.escape(name) + r"\s*\(([^)]*)\)", code, re.S)


def _has_c_linkage(code: str, at: int) -> bool:
    """`extern "C"` right before the kernel at `at`, or an `extern "C" { ... }` block open there."""
    if re.search(r'extern\s+"C"\s*$', code[:at]):
        return True
    for block in re.finditer(r'extern\s+"C"\s*\{', code[:at]):
        inner = code[block.end() : at]
        if inner.count("{") >= inner.count("}"):  # the block's own brace is still open
            return True
    return False


def expected_signature(spec: KernelSpec) -> str:
    args = ", ".join(f"{t} {n}" for n, t in spec.params)
    return f'extern "C" __global__ void {spec.name}({args})'


def check_source(spec: KernelSpec, text: str, path: str) -> None:
    """Raise AuditEnvironmentError naming file and line for a wrong entry point or an
    unsupported construct."""
    code = strip_comments(text)
    unsupported = first_unsupported(code)
    if unsupported is not None:
        lineno, token, what = unsupported
        raise AuditEnvironmentError(
            f"{path}:{lineno}: `{token}` ({what}) is not supported: kernels must be plain "
            "per-thread code so the CPU backend can run the same source"
        )
    m = _definition(code, spec.name)
    if m is None:
        defined = ", ".join(f"`{n}`" for n in re.findall(_GLOBAL + r"(\w+)\s*\(", code))
        found_note = f" (it defines {defined})" if defined else ""
        raise AuditEnvironmentError(
            f"{path}: no entry point `{spec.name}`{found_note}; expected {expected_signature(spec)}"
        )
    lineno = code.count("\n", 0, m.start()) + 1
    if not _has_c_linkage(code, m.start()):
        raise AuditEnvironmentError(
            f'{path}:{lineno}: entry point `{spec.name}` is not declared extern "C" (its symbol '
            f"would be C++-mangled); expected {expected_signature(spec)}"
        )
    found = [_param_type(p) for p in m.group(1).split(",") if p.strip()]
    wanted = [_normalise_type(t) for _, t in spec.params]
    if found != wanted:
        raise AuditEnvironmentError(
            f"{path}:{lineno}: entry point `{spec.name}` has parameter types ({', '.join(found)}); "
            f"expected {expected_signature(spec)}"
        )


@dataclass(frozen=True)
class KernelSet:
    sources: tuple[KernelSource, ...]
    ignored: tuple[str, ...] = ()  # .cu files in DIR that are no known kernel

    def with_patch(self, file: str, old: str, new: str, fault: str) -> KernelSet:
        """The same set with one source edited the way a fault edits it. The patch must apply:
        a fault that does not change the code would prove nothing."""
        out = []
        for s in self.sources:
            if s.spec.file == file:
                if old not in s.text:
                    raise AuditEnvironmentError(
                        f"fault {fault} cannot be applied to {s.path}: "
                        "the code it edits is not there"
                    )
                s = dataclasses.replace(s, text=s.text.replace(old, new), origin=f"fault:{fault}")
            out.append(s)
        return KernelSet(tuple(out), self.ignored)

    def headers(self) -> tuple[tuple[str, str], ...]:
        """(path as shown, sha256) of every header beside a --kernels source: code any kernel
        may include, so the document names it as it names the sources."""
        found = {}
        for s in self.sources:
            folder = posixpath.dirname(s.path)
            for relative, text in s.headers:
                digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
                found[posixpath.join(folder, relative)] = digest
        return tuple(sorted(found.items()))


BUNDLED_PREFIX = "egf-audit:"  # a bundled source's shown path: never mistaken for a trainer's file


def load_kernel_set(
    kernels_dir: str | os.PathLike[str] | None = None, only: bool = False
) -> KernelSet:
    """The bundled kernels, with any same-named file from `kernels_dir` in their place. `only`
    (a settings file names the folder): every kernel must be there; none is taken from the
    bundle, so a trainer repository is never audited against egf-audit's reference kernels."""
    replaced: dict[str, Path] = {}
    ignored: list[str] = []
    if kernels_dir is not None:
        root = Path(kernels_dir)
        if not root.is_dir():
            problem = "is a file, not a directory" if root.exists() else "no such directory"
            raise option_error(AuditEnvironmentError, "kernels", root, problem)
        for path in sorted(root.glob("*.cu")):
            if path.name in KERNELS_BY_FILE:
                replaced[path.name] = path
            else:
                ignored.append(path.name)
        if not replaced:
            raise option_error(
                AuditEnvironmentError,
                "kernels",
                root,
                f"holds no known kernel file (expected names like {KERNELS[0].file}; see "
                "kernels/README.md)",
            )
    if only:
        if kernels_dir is None:
            raise UsageError("the settings file names no kernels folder to audit")
        missing = [spec.file for spec in KERNELS if spec.file not in replaced]
        if missing:
            raise option_error(
                UsageError,
                "kernels",
                Path(kernels_dir).as_posix(),
                f"the folder lacks {len(missing)} of {len(KERNELS)} kernel files "
                f"({', '.join(missing)}): a repository whose settings name its kernels is "
                "audited from them alone, never from egf-audit's bundled ones",
            )
    headers = headers_under(Path(kernels_dir)) if kernels_dir is not None and replaced else ()
    sources = []
    for spec in KERNELS:
        if spec.file in replaced:
            path = replaced[spec.file]
            try:
                # bytes as written (BOM, CRLF): the document's sha256 is the file's own
                text = path.read_bytes().decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise AuditEnvironmentError(f"{path}: cannot be read: {exc}") from None
            src = KernelSource(spec, text, "kernels-dir", str(path), str(path.parent), headers)
        else:
            shown = f"{BUNDLED_PREFIX}kernels/{spec.file}"
            src = KernelSource(spec, bundled_source(spec.file), "bundled", shown)
        check_source(spec, src.text, src.path)
        sources.append(src)
    return KernelSet(tuple(sources), tuple(ignored))
