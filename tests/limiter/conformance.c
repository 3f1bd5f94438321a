/*
 * conformance: driver-API conformance probe for libgpushare_limiter.so, run against the
 * TEST-ONLY simulated driver, with the limiter preloaded under a 1 GiB cap or without it on a
 * 1 GiB simulated device (the oracle: both runs must print the same). Linked against
 * libcuda.so.1; prints KEY=VALUE lines.
 *
 *   edge PATH EDGE        one allocation through PATH at the cap edge EDGE, then its free:
 *                         PATH  alloc pitch managed async pool create array array3d mipmapped
 *                         EDGE  below (cap - 1 MiB) exact (the cap) over (cap + 1 byte, or the
 *                               smallest step over) zero overflow rows (pitch: 200000 rows of
 *                               1000 bytes) tallrows (300000 rows) mip2 (two mipmap levels)
 *   threads PATH N SECS   N threads allocate and free 100 MiB through PATH for SECS seconds;
 *                         PEAK is what the driver handed out at most (measured underneath)
 *   fork                  fork after cuInit with 600 MiB held; the child allocates and frees
 *   frees                 unknown, interior, double and null frees of every kind
 *   contexts              context destruction, primary release and reset, cuCtxCreate_v3/_v4
 *   procaddr              cuGetProcAddress/_v2 for 43 symbols, every version and flag (dladdr names)
 *   foreign LIB           dlsym through an unrelated library exporting cu* names, first
 *   rewrite               another program rewrites the shared file while allocations go on
 *   arrays KIND           arrays of about 300 MiB with rows padded by the driver, created until
 *                         refused: KIND array array3d mipmapped bc1 bc7 deferred
 *   vmm                   cuMemCreate memory released while still mapped, then unmapped
 *   async KIND            stream-ordered allocations: otherdev (on a stream of device 1 while
 *                         device 0's context is current), reuse-off / reuse-on (900 MiB freed
 *                         on one stream, 900 MiB asked on another before a synchronisation)
 *   graph KIND            graph memory: nodes (cuGraphAddMemAllocNode, 900 MiB), capture
 *                         (cuMemAllocAsync captured, 900 MiB), over (two 900 MiB nodes),
 *                         capture-held (900 MiB captured while 600 MiB are held)
 *   legacy                the pre-3.2/4.0/11.0 entry points (no _v2), found with dlsym and
 *                         cuGetProcAddress: allocations, frees, reports, context destruction
 *
 * The probes' own oracle is what the simulated driver holds underneath the limiter
 * (gpushare_sim_mem_used, gpushare_sim_mem_peak), not what the limiter reports.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)
#define CAP (1024ull * MIB)

static void die(const char *what, int rc) { fprintf(stderr, "conformance: %s (%d)\n", what, rc); exit(3); }

static CUdevice dev;
static CUcontext ctx;

static void init(void) {
    int r;
    if ((r = cuInit(0))) die("cuInit", r);
    if ((r = cuDeviceGet(&dev, 0))) die("cuDeviceGet", r);
    if ((r = cuCtxCreate(&ctx, 0, dev))) die("cuCtxCreate", r);
}

static size_t meminfo_free(void) {
    size_t fr = 0, tot = 0;
    int r = cuMemGetInfo(&fr, &tot);
    if (r) die("cuMemGetInfo", r);
    return fr;
}

/* One object made through a path, and how to free it. */
typedef struct { const char *path; CUdeviceptr ptr; CUmemGenericAllocationHandle handle; CUarray array; CUmipmappedArray mip; CUmemoryPool pool; } obj_t;

static CUmemAllocationProp prop(void) {
    CUmemAllocationProp p; memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = dev;
    return p;
}

/* Allocates `size` bytes (or the path's shape for it) through `o->path`. */
static CUresult make(obj_t *o, unsigned long long size, const char *edge) {
    const char *p = o->path;
    size_t pitch;
    if (!strcmp(p, "alloc")) return cuMemAlloc(&o->ptr, size);
    if (!strcmp(p, "managed")) return cuMemAllocManaged(&o->ptr, size, CU_MEM_ATTACH_GLOBAL);
    if (!strcmp(p, "async")) return cuMemAllocAsync(&o->ptr, size, NULL);
    if (!strcmp(p, "pool")) {
        if (!o->pool) {
            CUmemPoolProps props; memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE; props.location.id = dev;
            int r = cuMemPoolCreate(&o->pool, &props);
            if (r) die("cuMemPoolCreate", r);
        }
        return cuMemAllocFromPoolAsync(&o->ptr, size, o->pool, NULL);
    }
    if (!strcmp(p, "create")) { CUmemAllocationProp pr = prop(); return cuMemCreate(&o->handle, size, &pr, 0); }
    if (!strcmp(p, "pitch")) {
        if (edge && !strcmp(edge, "rows")) return cuMemAllocPitch(&o->ptr, &pitch, 1000, 200000, 4);
        if (edge && !strcmp(edge, "tallrows")) return cuMemAllocPitch(&o->ptr, &pitch, 1000, 300000, 4);
        if (edge && !strcmp(edge, "overflow")) return cuMemAllocPitch(&o->ptr, &pitch, SIZE_MAX / 2, 4, 4);
        return cuMemAllocPitch(&o->ptr, &pitch, size, 1, 4);
    }
    if (!strcmp(p, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = { size, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1 };
        if (edge && !strcmp(edge, "overflow")) { d.Width = SIZE_MAX; d.Height = 4; d.Format = CU_AD_FORMAT_FLOAT; d.NumChannels = 4; }
        return cuArrayCreate(&o->array, &d);
    }
    /* 3D and mipmapped: 1 MiB rows (1024 x 1024 bytes per slice for 3D); `size` picks the count. */
    CUDA_ARRAY3D_DESCRIPTOR d; memset(&d, 0, sizeof d);
    d.Format = CU_AD_FORMAT_UNSIGNED_INT8; d.NumChannels = 1;
    unsigned levels = 1;
    int is3d = !strcmp(p, "array3d");
    if (is3d) { d.Width = 1024; d.Height = 1024; d.Depth = size / MIB; }
    else { d.Width = MIB; d.Height = size / MIB; }
    if (edge && !strcmp(edge, "over")) { if (is3d) d.Width += 1; else d.Width += 1; }
    if (edge && !strcmp(edge, "zero")) d.Width = 0;
    if (edge && !strcmp(edge, "overflow")) { d.Width = d.Height = 1ull << 22; d.Depth = is3d ? 1ull << 22 : 0; d.Format = CU_AD_FORMAT_FLOAT; d.NumChannels = 4; }
    if (edge && !strcmp(edge, "mip2")) { d.Width = MIB; d.Height = 512; levels = 2; }
    if (is3d) return cuArray3DCreate(&o->array, &d);
    if (!strcmp(p, "mipmapped")) return cuMipmappedArrayCreate(&o->mip, &d, levels);
    fprintf(stderr, "conformance: unknown path %s\n", p); exit(2);
}

static CUresult unmake(obj_t *o) {
    const char *p = o->path;
    if (!strcmp(p, "alloc") || !strcmp(p, "managed") || !strcmp(p, "pitch")) return cuMemFree(o->ptr);
    if (!strcmp(p, "async") || !strcmp(p, "pool")) {
        CUresult r = cuMemFreeAsync(o->ptr, NULL);
        cuCtxSynchronize();
        return r;
    }
    if (!strcmp(p, "create")) return cuMemRelease(o->handle);
    if (!strcmp(p, "mipmapped")) return cuMipmappedArrayDestroy(o->mip);
    return cuArrayDestroy(o->array);
}

static int scenario_edge(const char *path, const char *edge) {
    init();
    unsigned long long size =
        !strcmp(edge, "below") ? CAP - MIB : !strcmp(edge, "exact") ? CAP : !strcmp(edge, "over") ? CAP + 1
        : !strcmp(edge, "zero") ? 0 : !strcmp(edge, "overflow") ? (unsigned long long)SIZE_MAX : CAP / 2;
    if (!strcmp(edge, "over") && (!strcmp(path, "array3d") || !strcmp(path, "mipmapped"))) size = CAP;
    obj_t o; memset(&o, 0, sizeof o); o.path = path;
    CUresult r = make(&o, size, edge);
    printf("RC=%d\nFREE=%zu\n", r, meminfo_free());
    if (r == CUDA_SUCCESS) printf("FREE_RC=%d\n", unmake(&o));
    if (o.pool) cuMemPoolDestroy(o.pool);
    printf("FREE_AFTER=%zu\n", meminfo_free());
    return 0;
}

/* ---- many threads at the cap ---- */

static const char *thread_path;
static volatile int stop;
static unsigned long long oks, ooms, others;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker(void *arg) {
    (void)arg;
    int r = cuCtxSetCurrent(ctx);
    if (r) die("cuCtxSetCurrent", r);
    unsigned long long ok = 0, oom = 0, other = 0;
    while (!stop) {
        obj_t o; memset(&o, 0, sizeof o); o.path = thread_path;
        CUresult rc = make(&o, 100 * MIB, NULL);
        if (rc == CUDA_SUCCESS) { ok++; usleep(200); unmake(&o); }
        else if (rc == CUDA_ERROR_OUT_OF_MEMORY) oom++;
        else other++;
    }
    pthread_mutex_lock(&count_lock);
    oks += ok; ooms += oom; others += other;
    pthread_mutex_unlock(&count_lock);
    return NULL;
}

static int scenario_threads(const char *path, int n, double secs) {
    init();
    thread_path = path;
    unsigned long long (*peak)(int) = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "gpushare_sim_mem_peak");
    if (!peak) die("the simulated driver's gpushare_sim_mem_peak is missing", 0);
    pthread_t t[64];
    if (n > 64) n = 64;
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, NULL);
    printf("STARTED=1\n");
    usleep((useconds_t)(secs * 1e6));
    stop = 1;
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    cuCtxSynchronize();
    printf("OK=%llu\nOOM=%llu\nOTHER=%llu\nPEAK=%llu\nFREE_AFTER=%zu\n", oks, ooms, others, peak(0), meminfo_free());
    return 0;
}

/* ---- fork after cuInit ---- */

static int scenario_fork(void) {
    init();
    CUdeviceptr held, p;
    int r = cuMemAlloc(&held, 600 * MIB);
    printf("PARENT_HELD_RC=%d\n", r);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        printf("CHILD_OVER_RC=%d\n", cuMemAlloc(&p, 600 * MIB));
        CUresult fits = cuMemAlloc(&p, 300 * MIB);
        printf("CHILD_FITS_RC=%d\n", fits);
        /* The parent's pointer, freed in the child: its memory stays the parent's. */
        printf("CHILD_FREE_INHERITED_RC=%d\n", cuMemFree(held));
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    waitpid(child, &st, 0);
    printf("CHILD_EXIT=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    printf("PARENT_OVER_RC=%d\n", cuMemAlloc(&p, 500 * MIB));
    r = cuMemAlloc(&p, 400 * MIB);
    printf("PARENT_FITS_RC=%d\n", r);
    return 0;
}

/* ---- frees the limiter did not count ---- */

static int scenario_frees(void) {
    init();
    unsigned long long (*last)(void) = (unsigned long long (*)(void))dlsym(RTLD_DEFAULT, "gpushare_sim_last_free");
    if (!last) die("the simulated driver's gpushare_sim_last_free is missing", 0);
    CUdeviceptr a; CUarray arr;
    int r = cuMemAlloc(&a, 64 * MIB);
    if (r) die("cuMemAlloc", r);
    const CUdeviceptr unknown = 0xdead0000ull;
    /* Each call first, then what the driver saw (C leaves argument order open). */
    r = cuMemFree(unknown);
    printf("UNKNOWN_RC=%d\nUNKNOWN_SEEN=%d\n", r, last() == unknown);
    r = cuMemFree(a + 4096);
    printf("INTERIOR_RC=%d\nINTERIOR_SEEN=%d\n", r, last() == a + 4096);
    r = cuMemFree(a);
    printf("FREE_RC=%d\n", r);
    r = cuMemFree(a);
    printf("DOUBLE_RC=%d\nDOUBLE_SEEN=%d\n", r, last() == a);
    r = cuMemFree(0);
    printf("NULL_RC=%d\n", r);
    r = cuMemFreeAsync(unknown + 512, NULL);
    printf("ASYNC_UNKNOWN_RC=%d\nASYNC_UNKNOWN_SEEN=%d\n", r, last() == unknown + 512);
    r = cuMemRelease(0x5eed0000ull);
    printf("RELEASE_UNKNOWN_RC=%d\n", r);
    r = cuArrayDestroy((CUarray)0xbad0000ull);
    printf("ARRAY_UNKNOWN_RC=%d\n", r);
    CUDA_ARRAY_DESCRIPTOR d = { MIB, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1 };
    r = cuArrayCreate(&arr, &d);
    printf("ARRAY_RC=%d\n", r);
    r = cuArrayDestroy(arr);
    printf("ARRAY_DESTROY_RC=%d\n", r);
    r = cuArrayDestroy(arr);
    printf("ARRAY_DOUBLE_RC=%d\n", r);
    printf("FREE_AFTER=%zu\n", meminfo_free());
    return 0;
}

/* ---- context lifetime ---- */

static int scenario_contexts(void) {
    int r;
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0))) die("init", r);
    CUcontext c, p1, p2; CUdeviceptr a, b; CUarray arr;
    CUDA_ARRAY_DESCRIPTOR d = { 100 * MIB, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1 };
    /* A created context: its allocations and arrays go with it. */
    if ((r = cuCtxCreate(&c, 0, dev))) die("cuCtxCreate", r);
    printf("CTX_ALLOC_RC=%d\nCTX_ARRAY_RC=%d\n", cuMemAlloc(&a, 600 * MIB), cuArrayCreate(&arr, &d));
    printf("CTX_FREE=%zu\n", meminfo_free());
    printf("CTX_DESTROY_RC=%d\n", cuCtxDestroy(c));
    if ((r = cuCtxCreate(&c, 0, dev))) die("cuCtxCreate", r);
    printf("AFTER_DESTROY_FREE=%zu\n", meminfo_free());
    printf("AFTER_DESTROY_ALLOC_RC=%d\n", cuMemAlloc(&b, 900 * MIB));
    cuMemFree(b);
    cuCtxDestroy(c);
    /* The primary context: retained twice, released once (still alive), then once more. */
    if ((r = cuDevicePrimaryCtxRetain(&p1, dev)) || (r = cuCtxSetCurrent(p1))) die("primary", r);
    if ((r = cuDevicePrimaryCtxRetain(&p2, dev))) die("primary again", r);
    printf("PRIMARY_ALLOC_RC=%d\n", cuMemAlloc(&a, 600 * MIB));
    printf("PRIMARY_RELEASE_1_RC=%d\n", cuDevicePrimaryCtxRelease(dev));
    printf("PRIMARY_STILL_OVER_RC=%d\n", cuMemAlloc(&b, 600 * MIB));
    printf("PRIMARY_RELEASE_2_RC=%d\n", cuDevicePrimaryCtxRelease(dev));
    if ((r = cuDevicePrimaryCtxRetain(&p1, dev)) || (r = cuCtxSetCurrent(p1))) die("primary", r);
    printf("AFTER_RELEASE_FREE=%zu\n", meminfo_free());
    printf("AFTER_RELEASE_ALLOC_RC=%d\n", cuMemAlloc(&b, 900 * MIB));
    printf("PRIMARY_RESET_RC=%d\n", cuDevicePrimaryCtxReset(dev));
    if ((r = cuDevicePrimaryCtxRetain(&p1, dev)) || (r = cuCtxSetCurrent(p1))) die("primary", r);
    printf("AFTER_RESET_FREE=%zu\n", meminfo_free());
    printf("AFTER_RESET_ALLOC_RC=%d\n", cuMemAlloc(&b, 900 * MIB));
    cuDevicePrimaryCtxReset(dev);
    /* cuCtxCreate_v3 and _v4 (found by name: cuda.h 11.8 has no _v4). */
    CUresult (*v3)(CUcontext *, void *, int, unsigned, CUdevice) = dlsym(RTLD_DEFAULT, "cuCtxCreate_v3");
    CUresult (*v4)(CUcontext *, void *, unsigned, CUdevice) = dlsym(RTLD_DEFAULT, "cuCtxCreate_v4");
    if (!v3 || !v4) die("no cuCtxCreate_v3/_v4", 0);
    printf("V3_RC=%d\n", v3(&c, NULL, 0, 0, dev));
    printf("V3_FREE=%zu\n", meminfo_free());
    printf("V3_ALLOC_RC=%d\n", cuMemAlloc(&a, 600 * MIB));
    printf("V3_DESTROY_RC=%d\n", cuCtxDestroy(c));
    printf("V4_RC=%d\n", v4(&c, NULL, 0, dev));
    printf("V4_FREE=%zu\n", meminfo_free());
    printf("V4_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    printf("V4_DESTROY_RC=%d\n", cuCtxDestroy(c));
    /* Two contexts: the device's share of context memory goes only with the last one. */
    CUcontext c2;
    if ((r = cuCtxCreate(&c, 0, dev)) || (r = cuCtxCreate(&c2, 0, dev))) die("two contexts", r);
    printf("TWO_DESTROY_FIRST_RC=%d\n", cuCtxDestroy(c));
    printf("TWO_ONE_LEFT_FREE=%zu\n", meminfo_free());
    printf("TWO_DESTROY_SECOND_RC=%d\n", cuCtxDestroy(c2));
    if ((r = cuCtxCreate(&c, 0, dev))) die("cuCtxCreate", r);
    printf("TWO_NEXT_FREE=%zu\n", meminfo_free());
    return 0;
}

/* ---- cuGetProcAddress with every version and flag ---- */

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static void show(const char *form, const char *sym, int ver, unsigned long long flags, CUresult rc, int status, void *p) {
    Dl_info info;
    const char *name = "-", *lib = "-";
    if (p && dladdr(p, &info) && info.dli_sname) { name = info.dli_sname; lib = base_name(info.dli_fname); }
    printf("PA %s %s %d %llu rc=%d status=%d name=%s lib=%s\n", form, sym, ver, flags, rc, status, name, lib);
}

static int scenario_procaddr(void) {
    int r;
    if ((r = cuInit(0))) die("cuInit", r);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*gp11)(const char *, void **, int, cuuint64_t) = dlsym(drv, "cuGetProcAddress");
    CUresult (*gp12)(const char *, void **, int, cuuint64_t, int *) = dlsym(drv, "cuGetProcAddress_v2");
    if (!gp11 || !gp12) die("no cuGetProcAddress", 0);
    static const char *syms[] = {
        "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync",
        "cuMemCreate", "cuMemRelease", "cuMemFree", "cuMemFreeAsync", "cuArrayCreate", "cuArray3DCreate",
        "cuMipmappedArrayCreate", "cuArrayDestroy", "cuMipmappedArrayDestroy", "cuMemPoolCreate",
        "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuCtxSynchronize", "cuStreamSynchronize", "cuMemGetInfo",
        "cuDeviceTotalMem", "cuCtxCreate", "cuCtxDestroy", "cuDevicePrimaryCtxRetain",
        "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset", "cuLaunchKernel", "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel", "cuGraphLaunch", "cuGetProcAddress", "cuInit", "cuCtxGetCurrent",
        "cuMemAllocHost", "cuMemHostRegister", "cuMemGetAllocationGranularity", "cuMemMap", "cuMemUnmap",
        "cuMemPoolSetAttribute", "cuGraphInstantiateWithFlags", "cuGraphExecDestroy", "cuDeviceGraphMemTrim",
        "cuNoSuchThing",
    };
    static const int vers[] = { 2000, 3000, 3020, 4000, 6050, 11000, 11030, 11040, 11080, 12000, 12020, 12050 };
    static const unsigned long long flags[] = { CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
                                                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM };
    for (size_t s = 0; s < sizeof syms / sizeof *syms; s++)
        for (size_t v = 0; v < sizeof vers / sizeof *vers; v++)
            for (size_t f = 0; f < 3; f++) {
                void *p = NULL; int status = -1;
                CUresult rc = gp12(syms[s], &p, vers[v], flags[f], &status);
                show("v2", syms[s], vers[v], flags[f], rc, status, p);
                p = NULL;
                rc = gp11(syms[s], &p, vers[v], flags[f]);
                show("v1", syms[s], vers[v], flags[f], rc, -1, p);
            }
    return 0;
}

/* ---- dlsym through an unrelated library ---- */

static int scenario_foreign(const char *lib) {
    /* Before the program's first driver call, so the limiter has resolved nothing yet. */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) die(dlerror(), 0);
    CUresult (*alloc)(CUdeviceptr *, size_t) = dlsym(h, "cuMemAlloc_v2");
    Dl_info info;
    printf("FOREIGN_IS_ITS_OWN=%d\n", alloc && dladdr((void *)alloc, &info) && strstr(info.dli_fname, base_name(lib)) != NULL);
    CUdeviceptr p = 0;
    printf("FOREIGN_CALL_RC=%d\n", alloc ? alloc(&p, MIB) : -1);
    init();
    printf("LINKED_RC=%d\n", cuMemAlloc(&p, 600 * MIB));
    printf("LINKED_OVER_RC=%d\n", cuMemAlloc(&p, 600 * MIB));
    printf("FREE=%zu\n", meminfo_free());
    return 0;
}

/* ---- another program rewrites the shared file ---- */

static int scenario_rewrite(void) {
    init();
    CUdeviceptr p;
    printf("BEFORE_RC=%d\n", cuMemAlloc(&p, 100 * MIB));
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = path ? open(path, O_RDWR) : -1;
    if (fd < 0) die("open shared file", 0);
    /* A foreign header (an initialised flag and a major/minor version, HAMi-core style), and a
       bigger file. */
    int header[4] = { 19920718, 1, 1, 0 };
    if (pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header || ftruncate(fd, 8 * MIB)) die("rewrite", 0);
    close(fd);
    printf("AFTER_RC=%d\n", cuMemAlloc(&p, 100 * MIB));
    printf("FREE=%zu\n", meminfo_free());
    printf("FREE_RC=%d\n", cuMemFree(p));
    return 0;
}

/* ---- what the driver holds underneath ---- */

static unsigned long long used_mib(int d) {
    static unsigned long long (*used)(int);
    if (!used) used = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "gpushare_sim_mem_used");
    if (!used) die("the simulated driver's gpushare_sim_mem_used is missing", 0);
    return used(d) / MIB;
}

static unsigned long long peak_mib(int d) {
    static unsigned long long (*peak)(int);
    if (!peak) peak = (unsigned long long (*)(int))dlsym(RTLD_DEFAULT, "gpushare_sim_mem_peak");
    if (!peak) die("the simulated driver's gpushare_sim_mem_peak is missing", 0);
    return peak(d) / MIB;
}

/* ---- arrays as the driver lays them out ---- */

static int scenario_arrays(const char *kind) {
    init();
    enum { N = 10 };
    CUarray a[N] = { 0 };
    CUmipmappedArray m[N] = { 0 };
    int ok = 0, tries = !strcmp(kind, "deferred") ? 3 : N;
    for (int i = 0; i < tries; i++) {
        CUDA_ARRAY3D_DESCRIPTOR d; memset(&d, 0, sizeof d);
        d.Format = CU_AD_FORMAT_UNSIGNED_INT8; d.NumChannels = 1;
        CUresult r;
        /* Rows of 100 bytes: 600000 of them are 57 MiB of elements, 293 MiB at 512-byte rows. */
        if (!strcmp(kind, "array")) {
            CUDA_ARRAY_DESCRIPTOR d2 = { 100, 600000, CU_AD_FORMAT_UNSIGNED_INT8, 1 };
            r = cuArrayCreate(&a[i], &d2);
        } else if (!strcmp(kind, "array3d")) {
            d.Width = 100; d.Height = 1000; d.Depth = 600;
            r = cuArray3DCreate(&a[i], &d);
        } else if (!strcmp(kind, "mipmapped")) {
            d.Width = 100; d.Height = 600000;
            r = cuMipmappedArrayCreate(&m[i], &d, 1);
        } else if (!strcmp(kind, "bc1") || !strcmp(kind, "bc7")) {
            /* 16384 x 16384 texels: 128 MiB in BC1 (8-byte 4x4 blocks), 256 MiB in BC7. */
            d.Width = 16384; d.Height = 16384; d.NumChannels = 4;
            d.Format = !strcmp(kind, "bc1") ? CU_AD_FORMAT_BC1_UNORM : CU_AD_FORMAT_BC7_UNORM;
            r = cuArray3DCreate(&a[i], &d);
        } else if (!strcmp(kind, "deferred")) {
            /* 400 MiB of elements each, no memory until mapped. */
            d.Width = 1024; d.Height = 1024; d.Depth = 400; d.Flags = CUDA_ARRAY3D_DEFERRED_MAPPING;
            r = cuArray3DCreate(&a[i], &d);
        } else {
            fprintf(stderr, "conformance: unknown array kind %s\n", kind); exit(2);
        }
        if (r == CUDA_SUCCESS) ok++;
        else if (r != CUDA_ERROR_OUT_OF_MEMORY) die("array create", r);
    }
    printf("OK=%d\nHELD_MIB=%llu\n", ok, used_mib(0));
    if (!strcmp(kind, "deferred")) {
        CUdeviceptr p;
        CUresult r = cuMemAlloc(&p, 900 * MIB);
        printf("DEFERRED_ALLOC_RC=%d\n", r);
        if (r == CUDA_SUCCESS) cuMemFree(p);
    }
    for (int i = 0; i < N; i++) {
        if (a[i]) cuArrayDestroy(a[i]);
        if (m[i]) cuMipmappedArrayDestroy(m[i]);
    }
    printf("FREED_HELD_MIB=%llu\nFREE_AFTER=%zu\nPEAK_MIB=%llu\n", used_mib(0), meminfo_free(), peak_mib(0));
    return 0;
}

/* ---- virtual memory management ---- */

static int scenario_vmm(void) {
    init();
    CUmemAllocationProp pr = prop();
    const size_t sz = 600 * MIB;
    CUmemGenericAllocationHandle h1, h2, h3;
    CUdeviceptr va1, va2;
    int r;
    if ((r = cuMemAddressReserve(&va1, sz, 0, 0, 0)) || (r = cuMemAddressReserve(&va2, sz, 0, 0, 0))) die("reserve", r);
    /* Released while mapped: the memory stays until it is unmapped. */
    printf("CREATE1_RC=%d\n", cuMemCreate(&h1, sz, &pr, 0));
    printf("MAP1_RC=%d\n", cuMemMap(va1, sz, 0, h1, 0));
    printf("RELEASE1_RC=%d\n", cuMemRelease(h1));
    r = cuMemCreate(&h2, sz, &pr, 0);
    printf("CREATE2_RC=%d\nMAPPED_HELD_MIB=%llu\n", r, used_mib(0));
    if (r == CUDA_SUCCESS) cuMemRelease(h2);
    printf("UNMAP1_RC=%d\n", cuMemUnmap(va1, sz));
    printf("UNMAPPED_HELD_MIB=%llu\n", used_mib(0));
    r = cuMemCreate(&h2, sz, &pr, 0);
    printf("CREATE3_RC=%d\n", r);
    /* Mapped twice: the memory goes with the last unmap. */
    printf("MAP2A_RC=%d\n", cuMemMap(va1, sz, 0, h2, 0));
    printf("MAP2B_RC=%d\n", cuMemMap(va2, sz, 0, h2, 0));
    printf("RELEASE2_RC=%d\n", cuMemRelease(h2));
    printf("UNMAP2A_RC=%d\n", cuMemUnmap(va1, sz));
    r = cuMemCreate(&h3, sz, &pr, 0);
    printf("HALF_UNMAPPED_CREATE_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cuMemRelease(h3);
    printf("UNMAP2B_RC=%d\n", cuMemUnmap(va2, sz));
    r = cuMemCreate(&h3, sz, &pr, 0);
    printf("ALL_UNMAPPED_CREATE_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cuMemRelease(h3);
    cuMemAddressFree(va1, sz);
    cuMemAddressFree(va2, sz);
    printf("FREED_HELD_MIB=%llu\nFREE_AFTER=%zu\nPEAK_MIB=%llu\n", used_mib(0), meminfo_free(), peak_mib(0));
    return 0;
}

/* ---- stream-ordered allocations ---- */

static int scenario_async(const char *kind) {
    init();
    CUdeviceptr a = 0, b = 0;
    CUresult r;
    if (!strcmp(kind, "otherdev")) {
        CUcontext c1; CUstream s1;
        if ((r = cuCtxCreate(&c1, 0, 1)) || (r = cuStreamCreate(&s1, 0)) || (r = cuCtxSetCurrent(ctx))) die("device 1", r);
        printf("FIRST_RC=%d\n", cuMemAllocAsync(&a, 900 * MIB, s1));
        r = cuMemAllocAsync(&b, 900 * MIB, s1);
        printf("SECOND_RC=%d\nHELD1_MIB=%llu\nHELD0_MIB=%llu\n", r, used_mib(1), used_mib(0));
        if (a) cuMemFreeAsync(a, s1);
        if (b) cuMemFreeAsync(b, s1);
        if ((r = cuCtxSetCurrent(c1)) || (r = cuCtxSynchronize())) die("sync device 1", r);
        cuStreamDestroy(s1);
        printf("AFTER_HELD1_MIB=%llu\n", used_mib(1));
        r = cuMemAllocAsync(&a, 900 * MIB, NULL);
        printf("AFTER_RC=%d\n", r);
        printf("PEAK1_MIB=%llu\n", peak_mib(1));
        return 0;
    }
    CUstream s1, s2; CUmemoryPool pool;
    if ((r = cuStreamCreate(&s1, 0)) || (r = cuStreamCreate(&s2, 0)) || (r = cuDeviceGetDefaultMemPool(&pool, dev))) die("streams", r);
    if (!strcmp(kind, "reuse-off")) {
        int off = 0;
        if ((r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off)) ||
            (r = cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off))) die("reuse attributes", r);
    }
    printf("FIRST_RC=%d\n", cuMemAllocAsync(&a, 900 * MIB, s1));
    printf("FREE_RC=%d\n", cuMemFreeAsync(a, s1));
    r = cuMemAllocAsync(&b, 900 * MIB, s2);
    printf("OTHER_STREAM_RC=%d\nHELD_MIB=%llu\n", r, used_mib(0));
    if (r == CUDA_SUCCESS) cuMemFreeAsync(b, s2);
    cuCtxSynchronize();
    printf("SYNCED_HELD_MIB=%llu\n", used_mib(0));
    r = cuMemAllocAsync(&b, 900 * MIB, s2);
    printf("AFTER_SYNC_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cuMemFreeAsync(b, s2);
    cuCtxSynchronize();
    printf("FREE_AFTER=%zu\nPEAK_MIB=%llu\n", meminfo_free(), peak_mib(0));
    return 0;
}

/* ---- graph memory ---- */

static CUresult add_alloc_node(CUgraph g, size_t size, CUdeviceptr *out) {
    CUDA_MEM_ALLOC_NODE_PARAMS p; memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.poolProps.location.id = dev;
    p.bytesize = size;
    CUgraphNode n;
    CUresult r = cuGraphAddMemAllocNode(&n, g, NULL, 0, &p);
    *out = p.dptr;
    return r;
}

static int scenario_graph(const char *kind) {
    init();
    CUgraph g; CUgraphExec e; CUdeviceptr gp = 0, gp2 = 0, p;
    CUresult r;
    if (!strcmp(kind, "capture") || !strcmp(kind, "capture-held")) {
        CUstream s;
        /* capture-held: 600 MiB held while a 600 MiB allocation is captured (not allocated). */
        if (!strcmp(kind, "capture-held") && (r = cuMemAlloc(&p, 600 * MIB))) die("held", r);
        if ((r = cuStreamCreate(&s, 0)) || (r = cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL))) die("capture", r);
        printf("CAPTURED_RC=%d\n", cuMemAllocAsync(&gp, 900 * MIB, s));
        printf("CAPTURED_HELD_MIB=%llu\n", used_mib(0));
        if ((r = cuStreamEndCapture(s, &g))) die("end capture", r);
        if ((r = cuGraphInstantiate(&e, g, NULL, NULL, 0))) die("instantiate", r);
    } else {
        if ((r = cuGraphCreate(&g, 0))) die("graph", r);
        if ((r = add_alloc_node(g, 900 * MIB, &gp))) die("alloc node", r);
        if (!strcmp(kind, "over") && (r = add_alloc_node(g, 900 * MIB, &gp2))) die("alloc node", r);
        if ((r = cuGraphInstantiateWithFlags(&e, g, 0))) die("instantiate", r);
    }
    printf("LAUNCH_RC=%d\n", cuGraphLaunch(e, NULL));
    cuCtxSynchronize();
    printf("LAUNCHED_HELD_MIB=%llu\nLAUNCHED_FREE=%zu\n", used_mib(0), meminfo_free());
    r = cuMemAlloc(&p, 900 * MIB);
    printf("ALLOC_RC=%d\nALLOC_HELD_MIB=%llu\n", r, used_mib(0));
    if (r == CUDA_SUCCESS) cuMemFree(p);
    /* Freed: back in the graph pool, which keeps it until a trim. */
    cuMemFreeAsync(gp, NULL);
    if (gp2) cuMemFreeAsync(gp2, NULL);
    cuCtxSynchronize();
    printf("FREED_HELD_MIB=%llu\n", used_mib(0));
    r = cuMemAlloc(&p, 900 * MIB);
    printf("FREED_ALLOC_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cuMemFree(p);
    printf("TRIM_RC=%d\n", cuDeviceGraphMemTrim(dev));
    printf("TRIMMED_HELD_MIB=%llu\n", used_mib(0));
    r = cuMemAlloc(&p, 900 * MIB);
    printf("TRIMMED_ALLOC_RC=%d\n", r);
    if (r == CUDA_SUCCESS) cuMemFree(p);
    printf("EXEC_DESTROY_RC=%d\nGRAPH_DESTROY_RC=%d\n", cuGraphExecDestroy(e), cuGraphDestroy(g));
    printf("FREE_AFTER=%zu\nPEAK_MIB=%llu\n", meminfo_free(), peak_mib(0));
    return 0;
}

/* ---- the legacy entry points ---- */

typedef CUresult (*alloc32_t)(unsigned int *, unsigned int);
typedef CUresult (*free32_t)(unsigned int);
typedef CUresult (*info32_t)(unsigned int *, unsigned int *);
typedef CUresult (*total32_t)(unsigned int *, CUdevice);
typedef CUresult (*ctx_t)(CUcontext);
typedef CUresult (*dev_t_)(CUdevice);

static void *proc(const char *name, int version) {
    void *p = NULL;
    CUresult r = cuGetProcAddress(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT);
    if (r || !p) die(name, r);
    return p;
}

static int scenario_legacy(void) {
    init();
    int r;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    alloc32_t alloc_dl = (alloc32_t)dlsym(drv, "cuMemAlloc");
    alloc32_t alloc_pa = (alloc32_t)proc("cuMemAlloc", 3000);
    free32_t free_dl = (free32_t)dlsym(drv, "cuMemFree");
    info32_t info_dl = (info32_t)dlsym(drv, "cuMemGetInfo");
    total32_t total_dl = (total32_t)dlsym(drv, "cuDeviceTotalMem");
    ctx_t destroy_dl = (ctx_t)dlsym(drv, "cuCtxDestroy");
    dev_t_ reset_pa = (dev_t_)proc("cuDevicePrimaryCtxReset", 10000);
    dev_t_ release_dl = (dev_t_)dlsym(drv, "cuDevicePrimaryCtxRelease");
    if (!alloc_dl || !free_dl || !info_dl || !total_dl || !destroy_dl || !release_dl) die("legacy dlsym", 0);
    /* Allocations: 600 MiB at a time, three times through each lookup. */
    unsigned int p[6] = { 0 };
    int ok = 0;
    for (int i = 0; i < 6; i++) ok += (i < 3 ? alloc_dl : alloc_pa)(&p[i], 600 * MIB) == CUDA_SUCCESS;
    printf("ALLOC_OK=%d\nALLOC_HELD_MIB=%llu\n", ok, used_mib(0));
    unsigned int fr = 0, tot = 0;
    printf("INFO_RC=%d\n", info_dl(&fr, &tot));
    printf("INFO_TOTAL=%u\nINFO_FREE=%u\n", tot, fr);
    printf("TOTALMEM_RC=%d\n", total_dl(&tot, dev));
    printf("TOTALMEM=%u\n", tot);
    for (int i = 0; i < 6; i++) if (p[i]) free_dl(p[i]);
    printf("FREED_HELD_MIB=%llu\nFREED_FREE=%zu\n", used_mib(0), meminfo_free());
    /* Pitched memory and arrays through the legacy forms: rows of 100 bytes padded by the driver. */
    typedef CUresult (*pitch32_t)(unsigned int *, unsigned int *, unsigned int, unsigned int, unsigned int);
    typedef struct { unsigned int Width, Height; CUarray_format Format; unsigned int NumChannels; } desc_v1_t;
    typedef CUresult (*array32_t)(CUarray *, const desc_v1_t *);
    pitch32_t pitch_dl = (pitch32_t)dlsym(drv, "cuMemAllocPitch");
    array32_t array_pa = (array32_t)proc("cuArrayCreate", 3000);
    if (!pitch_dl) die("legacy cuMemAllocPitch", 0);
    unsigned int q[2] = { 0 }, pitch = 0;
    ok = 0;
    for (int i = 0; i < 2; i++) ok += pitch_dl(&q[i], &pitch, 100, 1200000, 4) == CUDA_SUCCESS;
    printf("PITCH_OK=%d\nPITCH_HELD_MIB=%llu\n", ok, used_mib(0));
    for (int i = 0; i < 2; i++) if (q[i]) free_dl(q[i]);
    CUarray arr[4] = { 0 };
    desc_v1_t d1 = { 100, 600000, CU_AD_FORMAT_UNSIGNED_INT8, 1 };
    ok = 0;
    for (int i = 0; i < 4; i++) ok += array_pa(&arr[i], &d1) == CUDA_SUCCESS;
    printf("ARRAY_OK=%d\nARRAY_HELD_MIB=%llu\n", ok, used_mib(0));
    for (int i = 0; i < 4; i++) if (arr[i]) cuArrayDestroy(arr[i]);
    printf("FREED2_HELD_MIB=%llu\nFREED2_FREE=%zu\n", used_mib(0), meminfo_free());
    /* Context destruction through the legacy forms gives the memory back. */
    CUdeviceptr a;
    printf("CTX_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    printf("CTX_DESTROY_RC=%d\n", destroy_dl(ctx));
    if ((r = cuCtxCreate(&ctx, 0, dev))) die("cuCtxCreate", r);
    printf("AFTER_DESTROY_HELD_MIB=%llu\n", used_mib(0));
    printf("AFTER_DESTROY_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    cuCtxDestroy(ctx);
    CUcontext pc;
    if ((r = cuDevicePrimaryCtxRetain(&pc, dev)) || (r = cuCtxSetCurrent(pc))) die("primary", r);
    printf("PRIMARY_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    printf("RESET_RC=%d\n", reset_pa(dev));
    if ((r = cuDevicePrimaryCtxRetain(&pc, dev)) || (r = cuCtxSetCurrent(pc))) die("primary", r);
    printf("AFTER_RESET_HELD_MIB=%llu\n", used_mib(0));
    printf("AFTER_RESET_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    printf("RELEASE_RC=%d\n", release_dl(dev));
    if ((r = cuDevicePrimaryCtxRetain(&pc, dev)) || (r = cuCtxSetCurrent(pc))) die("primary", r);
    printf("AFTER_RELEASE_HELD_MIB=%llu\n", used_mib(0));
    printf("AFTER_RELEASE_ALLOC_RC=%d\n", cuMemAlloc(&a, 900 * MIB));
    printf("PEAK_MIB=%llu\n", peak_mib(0));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 4 && !strcmp(argv[1], "edge")) return scenario_edge(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "threads")) return scenario_threads(argv[2], atoi(argv[3]), atof(argv[4]));
    if (argc == 2 && !strcmp(argv[1], "fork")) return scenario_fork();
    if (argc == 2 && !strcmp(argv[1], "frees")) return scenario_frees();
    if (argc == 2 && !strcmp(argv[1], "contexts")) return scenario_contexts();
    if (argc == 2 && !strcmp(argv[1], "procaddr")) return scenario_procaddr();
    if (argc == 3 && !strcmp(argv[1], "foreign")) return scenario_foreign(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "rewrite")) return scenario_rewrite();
    if (argc == 2 && !strcmp(argv[1], "legacy")) return scenario_legacy();
    if (argc == 3 && !strcmp(argv[1], "arrays")) return scenario_arrays(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "vmm")) return scenario_vmm();
    if (argc == 3 && !strcmp(argv[1], "async")) return scenario_async(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "graph")) return scenario_graph(argv[2]);
    fprintf(stderr, "usage: conformance edge|threads|fork|frees|contexts|procaddr|foreign|rewrite ...\n");
    return 2;
}
