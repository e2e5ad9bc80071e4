// The plan interpreter the stand-in programs share (make_plan.py writes the plans): the
// stand-in's SP14 steps as allocations, uploads, memsets, GEMMs and kernel launches, in the
// stand-in's order, and the layout file with the allocations' addresses. A program supplies how
// memory is allocated, written and launched on (a `Device`): trainer.cu through the runtime API
// and <<<>>>, trainer_driver.cpp through the driver API and NVRTC. Every GEMM goes through the
// cuBLAS entry point --gemm names (`sgemm`, `ex`, `strided`, `lt`; --device-scalars passes
// alpha and beta in device memory).
//
//   PROGRAM PLAN LAYOUT_TEMPLATE [--layout-out FILE] [--gemm sgemm|ex|strided|lt]
//           [--device-scalars] [PROGRAM'S OWN OPTIONS]
#pragma once
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cublas_decls.h"

struct Arg {
  void *p = nullptr;
  int i = 0;
  float f = 0.0f;
  long long l = 0;
  char kind = 'i';  // p, i, f or l: the plan's word for it
};

enum { OP_N = 0, OP_T = 1, R_32F = 0, COMPUTE_32F = 68, GEMM_DEFAULT = -1, POINTER_DEVICE = 1 };
enum { LT_TRANSA = 3, LT_TRANSB = 4, LT_POINTER_MODE = 2 };

static void fail(const char *what, long long code) {
  std::fprintf(stderr, "trainer: %s failed (%lld)\n", what, code);
  std::exit(1);
}
#define BLAS(x) do { int s_ = (x); if (s_ != 0) fail(#x, s_); } while (0)

template <typename Device> struct Trainer {
  Device device;
  std::map<std::string, char *> buffers;
  std::string gemm = "sgemm";
  bool device_scalars = false;
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  float *scalars = nullptr;  // device alpha, beta with --device-scalars

  char *at(const std::string &name, long long offset) {
    auto it = buffers.find(name);
    if (it == buffers.end()) fail(("no buffer " + name).c_str(), 0);
    return it->second + 4 * offset;
  }

  void run_gemm(std::istringstream &in) {
    std::string ta, tb, an, bn, cn;
    int m, n, k, lda, ldb, ldc;
    long long ao, bo, co;
    float alpha, beta;
    in >> ta >> tb >> m >> n >> k >> alpha >> beta >> an >> ao >> lda >> bn >> bo >> ldb >> cn >>
        co >> ldc;
    int opa = ta == "N" ? OP_N : OP_T, opb = tb == "N" ? OP_N : OP_T;
    const float *A = (const float *)at(an, ao), *B = (const float *)at(bn, bo);
    float *C = (float *)at(cn, co);
    const float *pa = &alpha, *pb = &beta;
    if (device_scalars) {
      float host[2] = {alpha, beta};
      device.upload((char *)scalars, host, 1, 2);
      pa = scalars, pb = scalars + 1;
    }
    if (gemm == "sgemm") {
      BLAS(cublasSgemm_v2(blas, opa, opb, m, n, k, pa, A, lda, B, ldb, pb, C, ldc));
    } else if (gemm == "ex") {
      BLAS(cublasGemmEx(blas, opa, opb, m, n, k, pa, A, R_32F, lda, B, R_32F, ldb, pb, C, R_32F,
                        ldc, COMPUTE_32F, GEMM_DEFAULT));
    } else if (gemm == "strided") {
      BLAS(cublasSgemmStridedBatched(blas, opa, opb, m, n, k, pa, A, lda, 0, B, ldb, 0, pb, C,
                                     ldc, 0, 1));
    } else {  // lt: D = C, column-major layouts as the classic call's
      cublasLtMatmulDesc_t desc;
      cublasLtMatrixLayout_t la, lb, lc;
      BLAS(cublasLtMatmulDescCreate(&desc, COMPUTE_32F, R_32F));
      BLAS(cublasLtMatmulDescSetAttribute(desc, LT_TRANSA, &opa, sizeof opa));
      BLAS(cublasLtMatmulDescSetAttribute(desc, LT_TRANSB, &opb, sizeof opb));
      int mode = device_scalars ? POINTER_DEVICE : 0;
      BLAS(cublasLtMatmulDescSetAttribute(desc, LT_POINTER_MODE, &mode, sizeof mode));
      BLAS(cublasLtMatrixLayoutCreate(&la, R_32F, opa == OP_N ? m : k, opa == OP_N ? k : m, lda));
      BLAS(cublasLtMatrixLayoutCreate(&lb, R_32F, opb == OP_N ? k : n, opb == OP_N ? n : k, ldb));
      BLAS(cublasLtMatrixLayoutCreate(&lc, R_32F, m, n, ldc));
      BLAS(cublasLtMatmul(lt, desc, pa, A, la, B, lb, pb, C, lc, C, lc, nullptr, nullptr, 0, 0));
      cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc), cublasLtMatmulDescDestroy(desc);
    }
  }

  void run_kernel(std::istringstream &in) {
    std::string name, kind, buf;
    unsigned blocks, threads;
    int count;
    in >> name >> blocks >> threads >> count;
    std::vector<Arg> args(count);
    for (Arg &a : args) {
      in >> kind;
      a.kind = kind[0];
      if (kind == "p") {
        long long offset;
        in >> buf >> offset;
        a.p = at(buf, offset);
      } else if (kind == "f") {
        unsigned bits;
        in >> std::hex >> bits >> std::dec;
        std::memcpy(&a.f, &bits, 4);
      } else if (kind == "l") {
        in >> a.l;
      } else {
        in >> a.i;
      }
    }
    device.launch(name, blocks, threads, args);
  }

  // every allocation made: the layout file, addresses in place of the template's @NAME
  void write_layout(const char *layout_template, const std::string &layout_out) {
    std::ifstream tf(layout_template);
    std::stringstream text;
    text << tf.rdbuf();
    std::string doc = text.str();
    for (auto &b : buffers) {
      std::string key = "\"@" + b.first + "\"";
      for (size_t at; (at = doc.find(key)) != std::string::npos;)
        doc.replace(at, key.size(), std::to_string((unsigned long long)b.second));
    }
    std::ofstream(layout_out) << doc;
  }
};

// Runs the plan; `own_option` takes the program's own options (returns false for none of its).
template <typename Device, typename Own>
int run_plan(int argc, char **argv, Own own_option) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: trainer PLAN LAYOUT_TEMPLATE [--layout-out FILE] "
                         "[--gemm sgemm|ex|strided|lt] [--device-scalars]\n");
    return 2;
  }
  Trainer<Device> t;
  std::string layout_out;
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--layout-out" && i + 1 < argc) layout_out = argv[++i];
    else if (a == "--gemm" && i + 1 < argc) t.gemm = argv[++i];
    else if (a == "--device-scalars") t.device_scalars = true;
    else if (!own_option(t.device, argc, argv, i)) fail(("unknown option " + a).c_str(), 0);
  }
  auto start = std::chrono::steady_clock::now();
  std::ifstream plan(argv[1]);
  if (!plan) fail("reading the plan", 0);
  t.device.start();
  BLAS(cublasCreate_v2(&t.blas));
  if (t.gemm == "lt") BLAS(cublasLtCreate(&t.lt));
  if (t.device_scalars) {
    t.scalars = (float *)t.device.alloc(2 * sizeof(float));
    BLAS(cublasSetPointerMode_v2(t.blas, POINTER_DEVICE));
  }
  bool layout_written = false;
  std::string line, op;
  int steps_ops = 0;
  while (std::getline(plan, line)) {
    std::istringstream in(line);
    in >> op;
    if (op != "buffer" && !layout_written && !layout_out.empty()) {
      t.write_layout(argv[2], layout_out);
      layout_written = true;
    }
    if (op == "buffer") {
      std::string name, dtype;
      long long elements;
      in >> name >> elements >> dtype;
      t.buffers[name] = t.device.alloc(4 * (elements > 0 ? elements : 1));
    } else if (op == "upload") {
      std::string name;
      long long offset, stride, count;
      in >> name >> offset >> stride >> count;
      std::vector<unsigned> words(count);
      for (auto &w : words) in >> std::hex >> w >> std::dec;
      t.device.upload(t.at(name, offset), words.data(), stride, count);
    } else if (op == "memset") {
      std::string name;
      long long offset, count;
      in >> name >> offset >> count;
      t.device.memset(t.at(name, offset), 4 * count);
    } else if (op == "gemm") {
      t.run_gemm(in);
    } else if (op == "kernel") {
      t.run_kernel(in);
    } else if (op == "end") {
      break;
    } else {
      fail(("unknown plan line " + op).c_str(), 0);
    }
    ++steps_ops;
  }
  t.device.synchronize();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trainer: %s: %d plan lines, GEMMs through %s%s, in %.3f s\n", argv[1], steps_ops,
              t.gemm.c_str(), t.device_scalars ? " (device scalars)" : "", seconds);
  return 0;
}
