/*
 * guesses: measures, on a real GPU (driver API, no limiter), what the simulated driver only
 * guesses (simdriver/src/cuda/guesses.rs) and what the limiter's conservative array layout
 * assumes (limiter/README.md, "Array layout"). Prints KEY=VALUE lines; tests/gpu/
 * validate-limiter.sh judges them. Memory taken is cuMemGetInfo's free before minus after
 * (the driver's own accounting; other processes on the GPU disturb it, so run it alone).
 *
 *   guesses          everything, on device 0
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024ull * 1024ull)

static void die(const char *what, int rc) { fprintf(stderr, "guesses: %s (%d)\n", what, rc); exit(3); }

static unsigned long long free_now(void) {
    size_t fr = 0, tot = 0;
    int r = cuMemGetInfo(&fr, &tot);
    if (r) die("cuMemGetInfo", r);
    return fr;
}

/* The limiter's conservative estimate of one array level set (limiter/src/arrays.rs). */
static unsigned long long estimate(size_t w, size_t h, size_t d, unsigned elem, int block, unsigned levels, unsigned long long align) {
    if (align < 512) align = 512;
    unsigned long long total = 0;
    for (unsigned l = 0; l < levels; l++) {
        unsigned long long lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        if (block) { lw = (lw + 3) / 4; lh = (lh + 3) / 4; }
        unsigned long long row = (lw * elem + align - 1) / align * align;
        total += row * lh * ld;
    }
    return (total + (64 << 10) - 1) / (64 << 10) * (64 << 10);
}

/* Creates one 3D array, prints what it took against the limiter's estimate. */
static void array(const char *name, size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned elem, int block, unsigned flags, unsigned long long align) {
    CUDA_ARRAY3D_DESCRIPTOR desc; memset(&desc, 0, sizeof desc);
    desc.Width = w; desc.Height = h; desc.Depth = d; desc.Format = f; desc.NumChannels = ch; desc.Flags = flags;
    unsigned long long before = free_now();
    CUarray a;
    int r = cuArray3DCreate(&a, &desc);
    unsigned long long taken = before - free_now();
    CUDA_ARRAY_MEMORY_REQUIREMENTS req; memset(&req, 0, sizeof req);
    CUdevice dev; cuCtxGetDevice(&dev);
    int rq = r ? -1 : cuArrayGetMemoryRequirements(&req, a, dev);
    printf("%s_RC=%d\n%s_TAKEN=%llu\n%s_ESTIMATE=%llu\n%s_REQUIREMENTS_RC=%d\n%s_REQUIREMENTS=%zu\n", name, r, name, taken, name,
           (flags & CUDA_ARRAY3D_DEFERRED_MAPPING) ? 0 : estimate(w, h, d, elem, block, 1, align), name, rq, name, req.size);
    if (!r) cuArrayDestroy(a);
}

int main(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[1], "guesses")) { fprintf(stderr, "usage: guesses guesses\n"); return 2; }
    CUdevice dev; CUcontext ctx; int r;
    /* The primary context: cuCtxCreate changed its signature in CUDA 13 (cuCtxCreate_v4). */
    if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) || (r = cuCtxSetCurrent(ctx)))
        die("init", r);
    int align = 0;
    cuDeviceGetAttribute(&align, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, dev);
    printf("TEXTURE_PITCH_ALIGNMENT=%d\n", align);
    /* Guess 1: array layouts (rows of 100 bytes; BC1 and BC7; a deferred-mapping array). */
    array("ROWS100", 100, 1000, 600, CU_AD_FORMAT_UNSIGNED_INT8, 1, 1, 0, 0, align);
    array("FLOAT4", 1024, 1024, 0, CU_AD_FORMAT_FLOAT, 4, 16, 0, 0, align);
    array("BC1", 16384, 16384, 0, CU_AD_FORMAT_BC1_UNORM, 4, 8, 1, 0, align);
    array("BC7", 16384, 16384, 0, CU_AD_FORMAT_BC7_UNORM, 4, 16, 1, 0, align);
    array("DEFERRED", 1024, 1024, 400, CU_AD_FORMAT_UNSIGNED_INT8, 1, 1, 0, CUDA_ARRAY3D_DEFERRED_MAPPING, align);
    /* Guess 2: pitch. */
    CUdeviceptr p; size_t pitch = 0;
    if (!cuMemAllocPitch(&p, &pitch, 1000, 16, 4)) { printf("PITCH_OF_1000=%zu\n", pitch); cuMemFree(p); }
    /* Guess 6: VMM granularity, and memory released while mapped. */
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = dev;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("VMM_GRANULARITY=%zu\n", gran);
    CUmemGenericAllocationHandle h; CUdeviceptr va; size_t sz = 256 * MIB;
    unsigned long long before = free_now();
    if (!cuMemCreate(&h, sz, &prop, 0) && !cuMemAddressReserve(&va, sz, 0, 0, 0) && !cuMemMap(va, sz, 0, h, 0)) {
        cuMemRelease(h);
        printf("VMM_RELEASED_MAPPED_TAKEN=%llu\n", before - free_now());
        cuMemUnmap(va, sz);
        printf("VMM_UNMAPPED_TAKEN=%llu\n", before - free_now());
        cuMemAddressFree(va, sz);
    }
    /* Guess 4: pool growth and cross-stream reuse with the reuse attributes on and off. */
    CUmemoryPool pool; CUstream s1, s2; CUdeviceptr a, b;
    cuDeviceGetDefaultMemPool(&pool, dev);
    cuStreamCreate(&s1, 0); cuStreamCreate(&s2, 0);
    cuuint64_t res = 0;
    if (!cuMemAllocAsync(&a, 1, s1)) {
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("POOL_STEP=%llu\n", (unsigned long long)res);
        cuMemFreeAsync(a, s1); cuCtxSynchronize();
    }
    /* Cross-stream reuse with the reuse attributes on (the default), then what a
     * synchronisation leaves reserved (release threshold 0). */
    cuMemPoolTrimTo(pool, 0);
    if (!cuMemAllocAsync(&a, 256 * MIB, s1) && !cuMemFreeAsync(a, s1) && !cuMemAllocAsync(&b, 256 * MIB, s2)) {
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("REUSE_ON_RESERVED=%llu\n", (unsigned long long)res);
        cuMemFreeAsync(b, s2);
        cuCtxSynchronize();
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("POOL_SYNCED_RESERVED=%llu\n", (unsigned long long)res);
    }
    cuMemPoolTrimTo(pool, 0);
    int off = 0;
    cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off);
    cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off);
    if (!cuMemAllocAsync(&a, 256 * MIB, s1) && !cuMemFreeAsync(a, s1) && !cuMemAllocAsync(&b, 256 * MIB, s2)) {
        cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("REUSE_OFF_RESERVED=%llu\n", (unsigned long long)res);
        cuMemFreeAsync(b, s2);
    }
    cuCtxSynchronize();
    /* Graph memory: kept in the graph pool after the free, until a trim. */
    CUgraph g; CUgraphExec e; CUgraphNode n;
    CUDA_MEM_ALLOC_NODE_PARAMS np; memset(&np, 0, sizeof np);
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE; np.poolProps.location.id = dev;
    np.bytesize = 256 * MIB;
    if (!cuGraphCreate(&g, 0) && !cuGraphAddMemAllocNode(&n, g, NULL, 0, &np) && !cuGraphInstantiateWithFlags(&e, g, 0)
        && !cuGraphLaunch(e, NULL) && !cuCtxSynchronize()) {
        cuMemFreeAsync(np.dptr, NULL); cuCtxSynchronize();
        cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("GRAPH_FREED_RESERVED=%llu\n", (unsigned long long)res);
        cuDeviceGraphMemTrim(dev);
        cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &res);
        printf("GRAPH_TRIMMED_RESERVED=%llu\n", (unsigned long long)res);
    }
    return 0;
}
