// libcudart.so.13 for the host replay: cudaGetFuncBySymbol over the stubs replay.c registers,
// with the runtime's last error, which the recorder clears after a stub it asked about in vain.
#include "fake_abi.h"

static const void *stubs[16];
static void *functions[16];
static int registered, last_error;

void fake_cudart_register(const void *stub, void *function) {
    stubs[registered] = stub;
    functions[registered++] = function;
}

int cudaGetFuncBySymbol(void **function, const void *stub) {
    for (int i = 0; i < registered; ++i) {
        if (stubs[i] == stub) {
            *function = functions[i];
            return 0;
        }
    }
    return last_error = 98;  // cudaErrorInvalidDeviceFunction
}

int cudaGetLastError(void) {
    int e = last_error;
    last_error = 0;
    return e;
}

int fake_cudart_last_error(void) { return last_error; }
