/*
 * fakecuda: a minimal stand-in for libcuda.so.1, for measuring the limiter's own cost per call
 * (scripts/bench-limiter.sh --fake). Independent of the TEST-ONLY simulated driver: no shared
 * state, no files, no locks, no cgroup lookups; each entry point does the least a driver must
 * (hand out a distinct pointer, say which context is current) so that what the limiter adds is
 * not hidden behind a slow driver call. One device (ordinal 0, 80 GiB), one context.
 *
 * Build: cc -O2 -shared -fPIC -o libcuda.so.1 fakecuda.c
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef uint64_t CUdeviceptr;

#define OK 0
#define INVALID_VALUE 1
#define INVALID_CONTEXT 201
#define NOT_FOUND 500

static char the_ctx, the_module, the_function, the_pool;
static __thread CUcontext current;
static uint64_t next_ptr = 1 << 20;
static const uint64_t TOTAL = 80ull << 30;

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 12020; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!n) return INVALID_VALUE; *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ord) {
    if (!d || ord != 0) return INVALID_VALUE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
    static const unsigned char u[16] = {0x5a, 0x1e, 0xfa, 0xce, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1};
    if (!uuid || d != 0) return INVALID_VALUE;
    memcpy(uuid, u, 16);
    return OK;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (!bytes || d != 0) return INVALID_VALUE;
    *bytes = TOTAL;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    (void)attr;
    if (!v || d != 0) return INVALID_VALUE;
    *v = 0;
    return OK;
}
CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags;
    if (!c || d != 0) return INVALID_VALUE;
    *c = current = &the_ctx;
    return OK;
}
CUresult cuCtxGetCurrent(CUcontext *c) { if (!c) return INVALID_VALUE; *c = current; return OK; }
CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return INVALID_VALUE;
    if (!current) return INVALID_CONTEXT;
    *d = 0;
    return OK;
}
CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active) {
    if (d != 0 || !flags || !active) return INVALID_VALUE;
    *flags = 0;
    *active = 0;
    return OK;
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
    if (!free || !total) return INVALID_VALUE;
    *free = TOTAL;
    *total = TOTAL;
    return OK;
}
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    (void)image;
    if (!m) return INVALID_VALUE;
    *m = &the_module;
    return OK;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)name;
    if (!f || m != &the_module) return INVALID_VALUE;
    *f = &the_function;
    return OK;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, CUstream s, void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)s;
    (void)params; (void)extra;
    return f == &the_function ? OK : INVALID_VALUE;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    if (!p || !size) return INVALID_VALUE;
    if (!current) return INVALID_CONTEXT;
    *p = __atomic_fetch_add(&next_ptr, (size + 511) & ~(uint64_t)511, __ATOMIC_RELAXED);
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return p ? OK : INVALID_VALUE; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) { (void)s; return cuMemAlloc_v2(p, size); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
CUresult cuStreamGetCtx(CUstream s, CUcontext *c) {
    (void)s;
    if (!c) return INVALID_VALUE;
    *c = current;
    return OK;
}
CUresult cuStreamIsCapturing(CUstream s, int *status) {
    (void)s;
    if (!status) return INVALID_VALUE;
    *status = 0;
    return OK;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d) {
    if (!p || d != 0) return INVALID_VALUE;
    *p = &the_pool;
    return OK;
}
CUresult cuDeviceGetMemPool(CUmemoryPool *p, CUdevice d) { return cuDeviceGetDefaultMemPool(p, d); }
CUresult cuMemPoolGetAttribute(CUmemoryPool p, int attr, void *value) {
    if (p != &the_pool || !value) return INVALID_VALUE;
    /* The reuse policies (1-3) are ints, the memory figures 64-bit. */
    memset(value, 0, attr <= 3 ? sizeof(int) : sizeof(uint64_t));
    return OK;
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    (void)symbol; (void)version; (void)flags;
    if (pfn) *pfn = NULL;
    return NOT_FOUND;
}
