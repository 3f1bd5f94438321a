/*
 * cuprobe: test program for libgpushare_limiter.so, run against the TEST-ONLY simulated driver
 * (or a real one). Reaches the driver one of three ways, chosen by the first argument:
 *   direct    linked against libcuda.so.1 (calls the cu* symbols)
 *   dlopen    dlopen("libcuda.so.1") + dlsym for every entry point
 *   procaddr  dlsym only cuGetProcAddress, everything else through it (CUDA 11 form)
 *   procaddr2 dlsym only cuGetProcAddress_v2, everything else through it (CUDA 12 form)
 * then runs a scenario and prints KEY=VALUE lines for the test to check:
 *   cap DEV CHUNK_MIB          allocate CHUNK_MIB chunks until OOM; report meminfo/totalmem
 *   hold DEV MIB               allocate MIB, print HELD=1, sleep until killed
 *   try DEV MIB                allocate MIB once, print RESULT=<CUresult>
 *   kinds DEV                  256 MiB through each counted allocation API (see below)
 *   pool DEV KEEP              stream-ordered allocations from the default pool (KEEP=1: release
 *                              threshold UINT64_MAX), reserved sizes, trim (see below)
 *   capasync DEV CHUNK_MIB POOL  cuMemAllocAsync (POOL=default) or cuMemAllocFromPoolAsync from a
 *                              created pool (POOL=created) until OOM; free, sync, destroy
 *   unknownfree DEV            free a pointer nobody allocated
 *   launch DEV SECONDS MODE    launch kernels for SECONDS (MODE: kernel|ex|coop|graph|mixed)
 *   nvml                       print NVML memory info of every device (v1 and v2)
 *   self                       cuGetProcAddress for itself and for a _ptsz symbol
 *   puts                       (no path argument) puts("PUTS=1"), for the interposer test
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

typedef CUresult (*getproc11_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*getproc12_t)(const char *, void **, int, cuuint64_t, int *);

/* cuLaunchKernelEx's config, enough for the simulated driver (it checks for non-NULL only). */
typedef struct { unsigned gx, gy, gz, bx, by, bz, shmem; void *stream; void *attrs; unsigned nattrs; } launch_config_t;

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, void *, CUstream);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemCreate)(unsigned long long *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(unsigned long long);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*LaunchKernelEx)(const void *, CUfunction, void **, void **);
    CUresult (*LaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **);
    CUresult (*GraphLaunch)(void *, CUstream);
    CUresult (*GraphCreate)(void **, unsigned);
    CUresult (*GraphInstantiateWithFlags)(void **, void *, unsigned long long);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
} cu;

static void *lib;
static getproc11_t gp11;
static getproc12_t gp12;
static const char *path;

static void die(const char *what) { fprintf(stderr, "cuprobe: %s\n", what); exit(3); }

/* `version` 0: the CUDA version the path stands for (11.8 or 12.2). */
static void *resolve_at(const char *versioned, const char *base, int version) {
    void *p = NULL;
    if (!strcmp(path, "dlopen")) {
        p = dlsym(lib, versioned);
    } else if (!strcmp(path, "procaddr")) {
        if (gp11(base, &p, version ? version : 11080, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS) p = NULL;
    } else {
        int status = -1;
        if (gp12(base, &p, version ? version : 12020, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS) p = NULL;
    }
    if (!p) { fprintf(stderr, "cuprobe: cannot resolve %s\n", versioned); exit(3); }
    return p;
}

#define R(field, versioned, base) cu.field = resolve_at(versioned, base, 0)

static void setup(void) {
    if (!strcmp(path, "direct")) {
        cu.Init = cuInit; cu.DeviceGet = cuDeviceGet; cu.CtxCreate = cuCtxCreate;
        cu.DevicePrimaryCtxRetain = cuDevicePrimaryCtxRetain; cu.CtxSetCurrent = cuCtxSetCurrent;
        cu.CtxSynchronize = cuCtxSynchronize; cu.MemAlloc = cuMemAlloc; cu.MemAllocPitch = cuMemAllocPitch;
        cu.MemAllocManaged = cuMemAllocManaged; cu.MemAllocAsync = cuMemAllocAsync;
        cu.MemAllocFromPoolAsync = (void *)cuMemAllocFromPoolAsync; cu.MemFree = cuMemFree;
        cu.MemFreeAsync = cuMemFreeAsync; cu.MemCreate = cuMemCreate; cu.MemRelease = cuMemRelease;
        cu.MemGetInfo = cuMemGetInfo; cu.DeviceTotalMem = cuDeviceTotalMem;
        cu.ModuleLoadData = cuModuleLoadData; cu.ModuleGetFunction = cuModuleGetFunction;
        cu.LaunchKernel = cuLaunchKernel; cu.LaunchKernelEx = dlsym(RTLD_DEFAULT, "cuLaunchKernelEx");
        cu.LaunchCooperativeKernel = cuLaunchCooperativeKernel; cu.GraphLaunch = (void *)cuGraphLaunch;
        cu.GraphCreate = (void *)cuGraphCreate; cu.GraphInstantiateWithFlags = (void *)cuGraphInstantiateWithFlags;
        cu.DeviceGetDefaultMemPool = cuDeviceGetDefaultMemPool; cu.DeviceGetMemPool = cuDeviceGetMemPool;
        cu.MemPoolCreate = cuMemPoolCreate; cu.MemPoolDestroy = cuMemPoolDestroy;
        cu.MemPoolSetAttribute = cuMemPoolSetAttribute; cu.MemPoolGetAttribute = cuMemPoolGetAttribute;
        cu.MemPoolTrimTo = cuMemPoolTrimTo;
        if (!cu.LaunchKernelEx) die("no cuLaunchKernelEx");
        return;
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) die(dlerror());
    if (!strcmp(path, "procaddr")) {
        gp11 = (getproc11_t)dlsym(lib, "cuGetProcAddress");
        if (!gp11) die("no cuGetProcAddress");
    } else if (!strcmp(path, "procaddr2")) {
        gp12 = (getproc12_t)dlsym(lib, "cuGetProcAddress_v2");
        if (!gp12) die("no cuGetProcAddress_v2");
    } else if (strcmp(path, "dlopen")) {
        die("unknown path");
    }
    R(Init, "cuInit", "cuInit"); R(DeviceGet, "cuDeviceGet", "cuDeviceGet");
    /* From CUDA 11.4 on "cuCtxCreate" is cuCtxCreate_v3 (another signature): ask for 3.2's. */
    cu.CtxCreate = resolve_at("cuCtxCreate_v2", "cuCtxCreate", 3020);
    R(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
    R(CtxSetCurrent, "cuCtxSetCurrent", "cuCtxSetCurrent");
    R(CtxSynchronize, "cuCtxSynchronize", "cuCtxSynchronize");
    R(MemAlloc, "cuMemAlloc_v2", "cuMemAlloc"); R(MemAllocPitch, "cuMemAllocPitch_v2", "cuMemAllocPitch");
    R(MemAllocManaged, "cuMemAllocManaged", "cuMemAllocManaged");
    R(MemAllocAsync, "cuMemAllocAsync", "cuMemAllocAsync");
    R(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync");
    R(MemFree, "cuMemFree_v2", "cuMemFree"); R(MemFreeAsync, "cuMemFreeAsync", "cuMemFreeAsync");
    R(MemCreate, "cuMemCreate", "cuMemCreate"); R(MemRelease, "cuMemRelease", "cuMemRelease");
    R(MemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo"); R(DeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem");
    R(ModuleLoadData, "cuModuleLoadData", "cuModuleLoadData");
    R(ModuleGetFunction, "cuModuleGetFunction", "cuModuleGetFunction");
    R(LaunchKernel, "cuLaunchKernel", "cuLaunchKernel"); R(LaunchKernelEx, "cuLaunchKernelEx", "cuLaunchKernelEx");
    R(LaunchCooperativeKernel, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel");
    R(GraphLaunch, "cuGraphLaunch", "cuGraphLaunch"); R(GraphCreate, "cuGraphCreate", "cuGraphCreate");
    R(GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags");
    R(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", "cuDeviceGetDefaultMemPool");
    R(DeviceGetMemPool, "cuDeviceGetMemPool", "cuDeviceGetMemPool");
    R(MemPoolCreate, "cuMemPoolCreate", "cuMemPoolCreate"); R(MemPoolDestroy, "cuMemPoolDestroy", "cuMemPoolDestroy");
    R(MemPoolSetAttribute, "cuMemPoolSetAttribute", "cuMemPoolSetAttribute");
    R(MemPoolGetAttribute, "cuMemPoolGetAttribute", "cuMemPoolGetAttribute");
    R(MemPoolTrimTo, "cuMemPoolTrimTo", "cuMemPoolTrimTo");
}

static CUdevice init_dev(int ordinal, int primary) {
    CUdevice d; CUcontext c;
    if (cu.Init(0)) die("cuInit");
    if (cu.DeviceGet(&d, ordinal)) die("cuDeviceGet");
    if (primary) {
        if (cu.DevicePrimaryCtxRetain(&c, d) || cu.CtxSetCurrent(c)) die("primary context");
    } else if (cu.CtxCreate(&c, 0, d)) {
        die("cuCtxCreate");
    }
    return d;
}

static double now_s(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void print_info(CUdevice d) {
    size_t fr = 0, tot = 0, tm = 0;
    CUresult r = cu.MemGetInfo(&fr, &tot);
    printf("MEMINFO_RC=%d\nMEMINFO_TOTAL=%zu\nMEMINFO_FREE=%zu\n", r, tot, fr);
    r = cu.DeviceTotalMem(&tm, d);
    printf("TOTALMEM_RC=%d\nTOTALMEM=%zu\n", r, tm);
}

static int scenario_cap(int dev, unsigned long long chunk_mib) {
    CUdevice d = init_dev(dev, 0);
    unsigned long long total = 0; CUdeviceptr p; CUresult r;
    while ((r = cu.MemAlloc(&p, chunk_mib * MIB)) == CUDA_SUCCESS) total += chunk_mib * MIB;
    printf("ALLOC_TOTAL=%llu\nOOM_RC=%d\n", total, r);
    print_info(d);
    return 0;
}

static int scenario_kinds(int dev) {
    CUdevice d = init_dev(dev, 1);
    CUdeviceptr a, b, c, e; size_t pitch; unsigned long long h = 0, h2 = 0; CUmemoryPool pool;
    if (cu.DeviceGetDefaultMemPool(&pool, d)) die("cuDeviceGetDefaultMemPool");
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = d;
    printf("PITCH_RC=%d\n", cu.MemAllocPitch(&a, &pitch, 256 * MIB, 1, 4));
    printf("MANAGED_RC=%d\n", cu.MemAllocManaged(&b, 256 * MIB, CU_MEM_ATTACH_GLOBAL));
    printf("ASYNC_RC=%d\n", cu.MemAllocAsync(&c, 256 * MIB, NULL));
    printf("POOL_RC=%d\n", cu.MemAllocFromPoolAsync(&e, 256 * MIB, pool, NULL));
    printf("CREATE_OVER_RC=%d\n", cu.MemCreate(&h, 2 * MIB, &prop, 0));
    printf("FREEASYNC_RC=%d\n", cu.MemFreeAsync(c, NULL));
    printf("SYNC_RC=%d\n", cu.CtxSynchronize());
    printf("CREATE_RC=%d\n", cu.MemCreate(&h2, 256 * MIB, &prop, 0));
    printf("ALLOC_OVER_RC=%d\n", cu.MemAlloc(&c, 2 * MIB));
    printf("RELEASE_RC=%d\n", cu.MemRelease(h2));
    printf("ALLOC_AFTER_RELEASE_RC=%d\n", cu.MemAlloc(&c, 256 * MIB));
    print_info(d);
    return 0;
}

static unsigned long long pool_attr(CUmemoryPool pool, CUmemPool_attribute a) {
    cuuint64_t v = 0;
    if (cu.MemPoolGetAttribute(pool, a, &v)) return ~0ull;
    return v;
}

static size_t meminfo_free(void) {
    size_t fr = 0, tot = 0;
    if (cu.MemGetInfo(&fr, &tot)) die("cuMemGetInfo");
    return fr;
}

/* 600 MiB from the default pool, freed; with KEEP the pool keeps it past synchronisation. */
static int scenario_pool(int dev, int keep) {
    CUdevice d = init_dev(dev, 1);
    CUmemoryPool pool, cur; CUdeviceptr a, b, c;
    printf("DEFPOOL_RC=%d\n", cu.DeviceGetDefaultMemPool(&pool, d));
    printf("CURPOOL_IS_DEFAULT=%d\n", !cu.DeviceGetMemPool(&cur, d) && cur == pool);
    if (keep) {
        cuuint64_t t = ~0ull;
        printf("THRESHOLD_RC=%d\n", cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
    }
    printf("ASYNC_RC=%d\n", cu.MemAllocAsync(&a, 600 * MIB, NULL));
    printf("RESERVED_1=%llu\nUSED_1=%llu\n", pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    CUresult r = cu.MemAllocAsync(&b, 600 * MIB, NULL);
    printf("ASYNC_OVER_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cu.MemFreeAsync(b, NULL);
    printf("FREE_RC=%d\n", cu.MemFreeAsync(a, NULL));
    printf("RESERVED_2=%llu\nUSED_2=%llu\n", pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    printf("SYNC_RC=%d\n", cu.CtxSynchronize());
    printf("RESERVED_3=%llu\nMEMINFO_FREE_3=%zu\n", pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), meminfo_free());
    r = cu.MemAlloc(&c, 600 * MIB);
    printf("ALLOC_OVER_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cu.MemFree(c);
    printf("REUSE_RC=%d\n", cu.MemAllocAsync(&b, 600 * MIB, NULL));
    printf("RESERVED_4=%llu\n", pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    cu.MemFreeAsync(b, NULL);
    cu.CtxSynchronize();
    printf("TRIM_RC=%d\n", cu.MemPoolTrimTo(pool, 0));
    printf("RESERVED_5=%llu\n", pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    printf("ALLOC_AFTER_TRIM_RC=%d\n", cu.MemAlloc(&c, 600 * MIB));
    print_info(d);
    return 0;
}

static int scenario_capasync(int dev, unsigned long long chunk_mib, const char *which) {
    CUdevice d = init_dev(dev, 1);
    CUmemoryPool pool = NULL; CUdeviceptr p[64]; int n = 0; CUresult r;
    int created = !strcmp(which, "created");
    if (created) {
        CUmemPoolProps props; memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = d;
        if (cu.MemPoolCreate(&pool, &props)) die("cuMemPoolCreate");
        cuuint64_t t = ~0ull;
        if (cu.MemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t)) die("threshold");
    }
    unsigned long long total = 0;
    while (n < 64 && (r = created ? cu.MemAllocFromPoolAsync(&p[n], chunk_mib * MIB, pool, NULL)
                                  : cu.MemAllocAsync(&p[n], chunk_mib * MIB, NULL)) == CUDA_SUCCESS) {
        total += chunk_mib * MIB; n++;
    }
    printf("ALLOC_TOTAL=%llu\nOOM_RC=%d\n", total, r);
    print_info(d);
    for (int i = 0; i < n; i++) cu.MemFreeAsync(p[i], NULL);
    printf("SYNC_RC=%d\n", cu.CtxSynchronize());
    printf("FREE_AFTER_SYNC=%zu\n", meminfo_free());
    if (created) {
        printf("DESTROY_RC=%d\n", cu.MemPoolDestroy(pool));
        printf("FREE_AFTER_DESTROY=%zu\n", meminfo_free());
    }
    return 0;
}

static int scenario_launch(int dev, double seconds, const char *mode) {
    init_dev(dev, 1);
    CUmodule m; CUfunction f; void *g = NULL, *ge = NULL;
    if (cu.ModuleLoadData(&m, "sim") || cu.ModuleGetFunction(&f, m, "k")) die("module");
    if (cu.GraphCreate(&g, 0) || cu.GraphInstantiateWithFlags(&ge, g, 0)) die("graph");
    launch_config_t cfg = {1, 1, 1, 32, 1, 1, 0, NULL, NULL, 0};
    unsigned long long n = 0; double t0 = now_s(), t;
    while ((t = now_s()) - t0 < seconds) {
        int which = !strcmp(mode, "mixed") ? (int)(n % 4) : !strcmp(mode, "ex") ? 1 : !strcmp(mode, "coop") ? 2 : !strcmp(mode, "graph") ? 3 : 0;
        CUresult r = which == 0 ? cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)
                   : which == 1 ? cu.LaunchKernelEx(&cfg, f, NULL, NULL)
                   : which == 2 ? cu.LaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL)
                   : cu.GraphLaunch(ge, NULL);
        if (r) { printf("LAUNCH_RC=%d\n", r); return 1; }
        n++;
    }
    cu.CtxSynchronize();
    printf("LAUNCHES=%llu\nELAPSED=%.6f\n", n, now_s() - t0);
    return 0;
}

static int scenario_nvml(void) {
    unsigned n = 0;
    if (nvmlInit_v2()) die("nvmlInit");
    nvmlDeviceGetCount_v2(&n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t h; nvmlMemory_t m; nvmlMemory_v2_t m2; memset(&m2, 0, sizeof m2); m2.version = nvmlMemory_v2;
        nvmlDeviceGetHandleByIndex_v2(i, &h);
        int r1 = nvmlDeviceGetMemoryInfo(h, &m);
        int r2 = nvmlDeviceGetMemoryInfo_v2(h, &m2);
        printf("NVML%u_RC=%d\nNVML%u_TOTAL=%llu\nNVML%u_USED=%llu\nNVML%u_FREE=%llu\n", i, r1, i, m.total, i, m.used, i, m.free);
        printf("NVML%u_V2_RC=%d\nNVML%u_V2_TOTAL=%llu\nNVML%u_V2_FREE=%llu\n", i, r2, i, m2.total, i, m2.free);
    }
    nvmlShutdown();
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "nvml")) return scenario_nvml();
    if (argc >= 2 && !strcmp(argv[1], "puts")) return puts("PUTS=1") < 0;
    if (argc < 3) die("usage: cuprobe direct|dlopen|procaddr|procaddr2 SCENARIO ARGS...");
    path = argv[1];
    setup();
    const char *s = argv[2];
    int dev = argc > 3 ? atoi(argv[3]) : 0;
    if (!strcmp(s, "cap") && argc == 5) return scenario_cap(dev, strtoull(argv[4], NULL, 10));
    if (!strcmp(s, "kinds")) return scenario_kinds(dev);
    if (!strcmp(s, "pool") && argc == 5) return scenario_pool(dev, atoi(argv[4]));
    if (!strcmp(s, "capasync") && argc == 6) return scenario_capasync(dev, strtoull(argv[4], NULL, 10), argv[5]);
    if (!strcmp(s, "hold") && argc == 5) {
        init_dev(dev, 0); CUdeviceptr p;
        CUresult r = cu.MemAlloc(&p, strtoull(argv[4], NULL, 10) * MIB);
        printf("HELD=%d\n", r == CUDA_SUCCESS);
        for (;;) pause();
    }
    if (!strcmp(s, "try") && argc == 5) {
        init_dev(dev, 0); CUdeviceptr p;
        printf("RESULT=%d\n", cu.MemAlloc(&p, strtoull(argv[4], NULL, 10) * MIB));
        return 0;
    }
    if (!strcmp(s, "unknownfree")) {
        init_dev(dev, 0); CUdeviceptr p;
        printf("UNKNOWN_FREE_RC=%d\n", cu.MemFree((CUdeviceptr)0xdead0000ull));
        CUresult ra = cu.MemAlloc(&p, MIB);
        CUresult rf = cu.MemFree(p);
        printf("ALLOC_RC=%d\nFREE_RC=%d\n", ra, rf);
        print_info(dev);
        return 0;
    }
    if (!strcmp(s, "launch") && argc == 6) return scenario_launch(dev, atof(argv[4]), argv[5]);
    if (!strcmp(s, "self")) {
        void *p = NULL, *q = NULL; int st = 0;
        getproc12_t g = (getproc12_t)dlsym(dlopen("libcuda.so.1", RTLD_NOW), "cuGetProcAddress_v2");
        if (!g) die("no cuGetProcAddress_v2");
        g("cuGetProcAddress", &p, 12020, 0, &st);
        printf("SELF_IS_DLSYM_RESULT=%d\n", p == (void *)g);
        printf("SELF_IS_DEFAULT=%d\n", p == dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
        g("cuLaunchKernel", &q, 12020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
        printf("PTSZ_IS_DEFAULT=%d\n", q == dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"));
        g("cuLaunchKernel", &q, 12020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
        printf("LEGACY_IS_DEFAULT=%d\n", q == dlsym(RTLD_DEFAULT, "cuLaunchKernel"));
        Dl_info info; void *mal = dlsym(RTLD_NEXT, "malloc");
        printf("RTLD_NEXT_MALLOC_OK=%d\n", mal != NULL && dladdr(mal, &info) && strstr(info.dli_fname, "libc.so") != NULL);
        return 0;
    }
    die("unknown scenario");
}
