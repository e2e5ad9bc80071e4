"""Where this machine's cuBLAS is, for nvcc: `include DIR` (cublas_v2.h) and `lib DIR NAME
NAME_LT` (libcublas.so.N and libcublasLt.so.N), one per line; a line is left out when nothing
is found. Looked for in CUDA_HOME (or /usr/local/cuda), then in the NVIDIA wheels of this
Python (nvidia/cu13, nvidia/cublas), then in the folders given as arguments."""

import glob
import os
import site
import sys


def main() -> None:
    roots = [os.environ.get("CUDA_HOME", "/usr/local/cuda"), "/usr/local/cuda"]
    for packages in site.getsitepackages():
        roots += glob.glob(f"{packages}/nvidia/cu1*") + glob.glob(f"{packages}/nvidia/cublas")
    roots += sys.argv[1:]
    includes = [d for r in roots for d in (f"{r}/include", f"{r}/targets/x86_64-linux/include", r)]
    include = next((d for d in includes if os.path.exists(f"{d}/cublas_v2.h")), None)
    if include:
        print("include", include)
    libs = [d for r in roots for d in (f"{r}/lib64", f"{r}/lib", f"{r}/targets/x86_64-linux/lib")]
    for folder in libs:
        blas = sorted(glob.glob(f"{folder}/libcublas.so.*"))
        blas_lt = sorted(glob.glob(f"{folder}/libcublasLt.so.*"))
        if blas and blas_lt:
            print("lib", folder, os.path.basename(blas[0]), os.path.basename(blas_lt[0]))
            return


if __name__ == "__main__":
    main()
