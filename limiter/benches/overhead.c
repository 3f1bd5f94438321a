/*
 * overhead: added cost per call of libgpushare_limiter.so on the TEST-ONLY simulated driver.
 *
 * One process, same run: the simulated driver's own entry points (dlopen("libcuda.so.1"))
 * and the limiter's wrappers (dlopen of the limiter, RTLD_LOCAL, so it does not interpose on
 * the program) are timed in alternating rounds; each round gives ns per call; the report is
 * the median over rounds, and the median of the per-round differences ("added").
 * Three pairs: cuLaunchKernel, cuMemAlloc_v2+cuMemFree_v2 and cuMemAllocAsync+cuMemFreeAsync
 * (1 MiB from the default pool, NULL stream).
 * Run through scripts/bench-limiter.sh, which sets the limits and the simulated driver up.
 *
 * usage: overhead LIMITER.so [ROUNDS [LAUNCHES_PER_ROUND [PAIRS_PER_ROUND]]]
 * (defaults 101, 20000, 2000; a fast driver needs more calls per round to rise above the clock)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_t)(CUdeviceptr, CUstream);

static double now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void *need(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) { fprintf(stderr, "overhead: %s: %s\n", name, dlerror()); exit(2); }
    return p;
}

static CUfunction fn;

static double time_launch(launch_t f, int n) {
    double t0 = now_ns();
    for (int i = 0; i < n; i++)
        if (f(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL)) { fprintf(stderr, "launch failed\n"); exit(2); }
    return (now_ns() - t0) / n;
}

static double time_alloc(alloc_t a, free_t fr, int n) {
    CUdeviceptr p;
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        if (a(&p, 1 << 20) || fr(p)) { fprintf(stderr, "alloc/free failed\n"); exit(2); }
    }
    return (now_ns() - t0) / n;
}

static double time_async(alloc_async_t a, free_async_t fr, int n) {
    CUdeviceptr p;
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        if (a(&p, 1 << 20, NULL) || fr(p, NULL)) { fprintf(stderr, "async alloc/free failed\n"); exit(2); }
    }
    return (now_ns() - t0) / n;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: overhead LIMITER.so [ROUNDS]\n"); return 2; }
    int rounds = argc > 2 ? atoi(argv[2]) : 101;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!drv) { fprintf(stderr, "overhead: %s\n", dlerror()); return 2; }
    void *lim = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lim) { fprintf(stderr, "overhead: %s\n", dlerror()); return 2; }

    CUresult (*init)(unsigned) = need(drv, "cuInit");
    CUresult (*dget)(CUdevice *, int) = need(drv, "cuDeviceGet");
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice) = need(lim, "cuCtxCreate_v2");
    CUresult (*mod_load)(CUmodule *, const void *) = need(drv, "cuModuleLoadData");
    CUresult (*get_fn)(CUfunction *, CUmodule, const char *) = need(drv, "cuModuleGetFunction");
    launch_t raw_launch = need(drv, "cuLaunchKernel"), lim_launch = need(lim, "cuLaunchKernel");
    alloc_t raw_alloc = need(drv, "cuMemAlloc_v2"), lim_alloc = need(lim, "cuMemAlloc_v2");
    free_t raw_free = need(drv, "cuMemFree_v2"), lim_free = need(lim, "cuMemFree_v2");
    alloc_async_t raw_aasync = need(drv, "cuMemAllocAsync"), lim_aasync = need(lim, "cuMemAllocAsync");
    free_async_t raw_fasync = need(drv, "cuMemFreeAsync"), lim_fasync = need(lim, "cuMemFreeAsync");

    CUdevice d; CUcontext c; CUmodule m;
    CUresult r;
    if ((r = init(0)) || (r = dget(&d, 0)) || (r = ctx_create(&c, 0, d)) || (r = mod_load(&m, "sim")) ||
        (r = get_fn(&fn, m, "k"))) {
        fprintf(stderr, "overhead: driver setup failed: CUresult %d\n", r); return 2;
    }

    /* Warm-up: lets the SM watcher see that launches cost nothing and open the bucket
       (the configured cap is never reached: simulated kernels take 0 us). */
    double t0 = now_ns();
    while (now_ns() - t0 < 2.5e9) time_launch(lim_launch, 1000);

    const int NL = argc > 3 ? atoi(argv[3]) : 20000, NA = argc > 4 ? atoi(argv[4]) : 2000;
    double *rl = malloc(rounds * sizeof(double)), *ll = malloc(rounds * sizeof(double)), *dl = malloc(rounds * sizeof(double));
    double *ra = malloc(rounds * sizeof(double)), *la = malloc(rounds * sizeof(double)), *da = malloc(rounds * sizeof(double));
    double *rs = malloc(rounds * sizeof(double)), *ls = malloc(rounds * sizeof(double)), *ds = malloc(rounds * sizeof(double));
    for (int r = 0; r < rounds; r++) {
        rl[r] = time_launch(raw_launch, NL);
        ll[r] = time_launch(lim_launch, NL);
        dl[r] = ll[r] - rl[r];
        ra[r] = time_alloc(raw_alloc, raw_free, NA);
        la[r] = time_alloc(lim_alloc, lim_free, NA);
        da[r] = la[r] - ra[r];
        rs[r] = time_async(raw_aasync, raw_fasync, NA);
        ls[r] = time_async(lim_aasync, lim_fasync, NA);
        ds[r] = ls[r] - rs[r];
    }
    printf("rounds: %d (launch: %d calls/round, alloc+free: %d pairs/round)\n", rounds, NL, NA);
    double mrl = median(rl, rounds), mll = median(ll, rounds);
    double mra = median(ra, rounds), mla = median(la, rounds);
    double mrs = median(rs, rounds), mls = median(ls, rounds);
    printf("cuLaunchKernel (SM cap set, under the cap): driver %.1f ns, with limiter %.1f ns, added %.1f ns (median), ratio %.3f\n",
           mrl, mll, median(dl, rounds), mll / mrl);
    printf("cuMemAlloc+cuMemFree pair (memory cap set): driver %.1f ns, with limiter %.1f ns, added %.1f ns (median), ratio %.3f\n",
           mra, mla, median(da, rounds), mla / mra);
    printf("cuMemAllocAsync+cuMemFreeAsync pair (default pool, memory cap set): driver %.1f ns, with limiter %.1f ns, added %.1f ns (median), ratio %.3f\n",
           mrs, mls, median(ds, rounds), mls / mrs);
    return 0;
}
