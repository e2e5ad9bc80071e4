// The stand-in's SP14 training steps through the driver API: memory from cuMemAlloc, uploads by
// cuMemcpyHtoD (cuMemcpy2D for a strided one), memsets by cuMemsetD8Async, and every kernel
// compiled at run time by NVRTC from its source file and launched with cuLaunchKernel, the way
// a Rust trainer on cudarc works. The plan and the GEMMs are plan_runner.h's, so a capture of
// this process is judged as the stand-in's is.
//
//   trainer_driver PLAN LAYOUT_TEMPLATE --kernel-sources DIR [--layout-out FILE]
//                  [--gemm sgemm|ex|strided|lt] [--device-scalars]
//
// DIR holds `<kernel>_kernel.cu` for every kernel the plan launches (the repository's kernels/).
// Built with the host compiler alone (no nvcc): the NVRTC prototypes are declared below.
#include <cuda.h>

#include "plan_runner.h"

extern "C" {
typedef struct _nvrtcProgram *nvrtcProgram;
int nvrtcCreateProgram(nvrtcProgram *, const char *, const char *, int, const char *const *,
                       const char *const *);
int nvrtcAddNameExpression(nvrtcProgram, const char *);
int nvrtcCompileProgram(nvrtcProgram, int, const char *const *);
int nvrtcGetPTXSize(nvrtcProgram, size_t *);
int nvrtcGetPTX(nvrtcProgram, char *);
int nvrtcGetLoweredName(nvrtcProgram, const char *, const char **);
int nvrtcGetProgramLogSize(nvrtcProgram, size_t *);
int nvrtcGetProgramLog(nvrtcProgram, char *);
int nvrtcDestroyProgram(nvrtcProgram *);
}

#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) fail(#x, r_); } while (0)
#define RTC(x) do { int r_ = (x); if (r_ != 0) fail(#x, r_); } while (0)

struct DriverDevice {
  std::string sources;  // --kernel-sources
  CUcontext context = nullptr;
  std::map<std::string, CUfunction> functions;

  void start() {
    if (sources.empty()) fail("--kernel-sources DIR is required", 0);
    CUdevice dev;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(&context, dev));
    CU(cuCtxSetCurrent(context));
  }
  char *alloc(long long bytes) {
    CUdeviceptr p;
    CU(cuMemAlloc(&p, bytes));
    return (char *)p;
  }
  void upload(char *dst, const void *words, long long stride, long long count) {
    if (stride == 1) {
      CU(cuMemcpyHtoD((CUdeviceptr)dst, words, 4 * count));
      return;
    }
    CUDA_MEMCPY2D c;
    std::memset(&c, 0, sizeof c);
    c.srcMemoryType = CU_MEMORYTYPE_HOST, c.srcHost = words, c.srcPitch = 4;
    c.dstMemoryType = CU_MEMORYTYPE_DEVICE, c.dstDevice = (CUdeviceptr)dst, c.dstPitch = 4 * stride;
    c.WidthInBytes = 4, c.Height = count;
    CU(cuMemcpy2D(&c));
  }
  void memset(char *dst, long long bytes) { CU(cuMemsetD8Async((CUdeviceptr)dst, 0, bytes, 0)); }

  // the kernel of `name`, compiled by NVRTC from DIR/<name>_kernel.cu at its first launch
  CUfunction function(const std::string &name) {
    auto it = functions.find(name);
    if (it != functions.end()) return it->second;
    std::string path = sources + "/" + name + "_kernel.cu";
    std::ifstream f(path);
    if (!f) fail(("reading " + path).c_str(), 0);
    std::stringstream text;
    text << f.rdbuf();
    nvrtcProgram prog;
    RTC(nvrtcCreateProgram(&prog, text.str().c_str(), path.c_str(), 0, nullptr, nullptr));
    RTC(nvrtcAddNameExpression(prog, name.c_str()));  // extern "C" or C++: its symbol either way
    const char *options[] = {"--gpu-architecture=compute_75", "-default-device"};
    if (nvrtcCompileProgram(prog, 2, options) != 0) {
      size_t size;
      nvrtcGetProgramLogSize(prog, &size);
      std::string log(size, '\0');
      nvrtcGetProgramLog(prog, &log[0]);
      std::fprintf(stderr, "trainer: %s does not compile: %s\n", path.c_str(), log.c_str());
      std::exit(1);
    }
    size_t size;
    RTC(nvrtcGetPTXSize(prog, &size));
    std::string ptx(size, '\0');
    RTC(nvrtcGetPTX(prog, &ptx[0]));
    const char *lowered;
    RTC(nvrtcGetLoweredName(prog, name.c_str(), &lowered));
    CUmodule module;
    CU(cuModuleLoadData(&module, ptx.c_str()));
    CUfunction fn;
    CU(cuModuleGetFunction(&fn, module, lowered));
    RTC(nvrtcDestroyProgram(&prog));
    return functions[name] = fn;
  }

  void launch(const std::string &name, unsigned blocks, unsigned threads,
              const std::vector<Arg> &args) {
    std::vector<Arg> values = args;
    std::vector<CUdeviceptr> pointers(values.size());
    std::vector<void *> params(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      Arg &a = values[i];
      pointers[i] = (CUdeviceptr)a.p;
      params[i] = a.kind == 'p' ? (void *)&pointers[i] : a.kind == 'f' ? (void *)&a.f
                : a.kind == 'l' ? (void *)&a.l : (void *)&a.i;
    }
    CU(cuLaunchKernel(function(name), blocks, 1, 1, threads, 1, 1, 0, nullptr, params.data(),
                      nullptr));
  }
  void synchronize() { CU(cuCtxSynchronize()); }
};

int main(int argc, char **argv) {
  return run_plan<DriverDevice>(argc, argv, [](DriverDevice &d, int n, char **v, int &i) {
    if (std::string(v[i]) != "--kernel-sources" || i + 1 >= n) return false;
    d.sources = v[++i];
    return true;
  });
}
