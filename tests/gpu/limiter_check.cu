// GPU validation program for libgpushare_limiter.so (real GPU only; see validate-limiter.sh).
// Built with Debian's nvidia-cuda-toolkit: nvcc -O2 -o limiter_check limiter_check.cu
// The CUDA runtime reaches the driver through cuGetProcAddress, so this exercises that path.
//   limiter_check meminfo            print MEMINFO_TOTAL / MEMINFO_FREE
//   limiter_check fill CHUNK_MIB     cudaMalloc chunks until failure, print ALLOC_TOTAL
//   limiter_check hold MIB           cudaMalloc MIB, print HELD=1, sleep until killed
//   limiter_check spin SECONDS       launch ~1 ms kernels for SECONDS, print KERNELS/ELAPSED
//   limiter_check smshare [SMS]     the share of the GPU's SMs this process gets (MPS active
//                                   thread percentage): blocks that each fill one SM for 2 ms,
//                                   4 per SM of SMS (default: the count the device reports, which
//                                   MPS may lower); print SMS (reported), SMS_BASE, OCCUPANCY,
//                                   LAUNCH_MS, EFFECTIVE_SMS, SHARE_PCT (of SMS_BASE),
//                                   DISTINCT_SMIDS
//   limiter_check bench              per-call cost: INIT_MS (first CUDA call), MALLOC_US
//                                   (1 MiB cudaMalloc+cudaFree), LAUNCH_US (empty kernel),
//                                   MEMINFO_US (cudaMemGetInfo)
// Times inside kernels come from %globaltimer (nanoseconds), not clock64 and the clock rate.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__device__ __forceinline__ unsigned long long gtimer(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin(long long ns, int *sink) {
    unsigned long long start = gtimer();
    while (gtimer() - start < (unsigned long long)ns) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

// One block per SM (its dynamic shared memory is more than half an SM's): spins `ns` and
// marks the SM it ran on.
__global__ void __launch_bounds__(1024, 1) hog(long long ns, unsigned *smids) {
    extern __shared__ volatile char smem[];
    if (threadIdx.x == 0) {
        unsigned id;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
        smem[0] = 1;
        atomicOr(&smids[(id / 32) % 64], 1u << (id % 32));
    }
    unsigned long long start = gtimer();
    while (gtimer() - start < (unsigned long long)ns) {
    }
}

__global__ void empty(void) {}

static double now_ms(void);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now_ms(void) { return now_s() * 1e3; }

static int ck(cudaError_t e, const char *what) {
    if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); exit(4); }
    return 0;
}

static int smshare(int base) {
    int sms = 0, optin = 0, per_sm = 0;
    ck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attr");
    if (base <= 0) base = sms;
    ck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), "attr");
    ck(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0), "attr");
    int smem = per_sm / 2 + 1024;
    if (smem > optin) smem = optin;
    ck(cudaFuncSetAttribute(hog, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attr");
    int occ = 0;
    ck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, hog, 1024, smem), "occupancy");
    if (occ < 1) occ = 1;
    unsigned *smids;
    ck(cudaMalloc(&smids, 64 * sizeof(unsigned)), "cudaMalloc");
    ck(cudaMemset(smids, 0, 64 * sizeof(unsigned)), "memset");
    const long long block_ns = 2000000;
    int blocks = 4 * base * occ, reps = 5;
    hog<<<blocks, 1024, smem>>>(block_ns, smids);  // warm-up
    ck(cudaDeviceSynchronize(), "warm-up");
    double t0 = now_ms();
    for (int i = 0; i < reps; i++) hog<<<blocks, 1024, smem>>>(block_ns, smids);
    ck(cudaDeviceSynchronize(), "hog");
    double launch_ms = (now_ms() - t0) / reps;
    unsigned h[64];
    ck(cudaMemcpy(h, smids, sizeof h, cudaMemcpyDeviceToHost), "memcpy");
    int distinct = 0;
    for (int i = 0; i < 64; i++) distinct += __builtin_popcount(h[i]);
    double eff = blocks * (block_ns / 1e6) / launch_ms / occ;
    printf("SMS=%d\nSMS_BASE=%d\nOCCUPANCY=%d\nBLOCKS=%d\nBLOCK_MS=%.1f\nLAUNCH_MS=%.2f\nEFFECTIVE_SMS=%.1f\nSHARE_PCT=%.0f\nDISTINCT_SMIDS=%d\n",
           sms, base, occ, blocks, block_ns / 1e6, launch_ms, eff, 100.0 * eff / base, distinct);
    return 0;
}

static int bench(double t_start) {
    ck(cudaFree(0), "init");
    printf("INIT_MS=%.2f\n", now_ms() - t_start);
    void *p;
    for (int i = 0; i < 20; i++) { ck(cudaMalloc(&p, 1 << 20), "cudaMalloc"); ck(cudaFree(p), "cudaFree"); }
    const int n_alloc = 1000, n_launch = 20000, n_info = 2000;
    double t0 = now_ms();
    for (int i = 0; i < n_alloc; i++) { ck(cudaMalloc(&p, 1 << 20), "cudaMalloc"); ck(cudaFree(p), "cudaFree"); }
    printf("MALLOC_US=%.2f\n", (now_ms() - t0) * 1e3 / n_alloc);
    empty<<<1, 32>>>();
    ck(cudaDeviceSynchronize(), "warm-up");
    t0 = now_ms();
    for (int i = 0; i < n_launch; i++) {
        empty<<<1, 32>>>();
        if (i % 100 == 99) ck(cudaDeviceSynchronize(), "sync");
    }
    ck(cudaDeviceSynchronize(), "sync");
    ck(cudaGetLastError(), "launch");
    printf("LAUNCH_US=%.3f\n", (now_ms() - t0) * 1e3 / n_launch);
    size_t fr, tot;
    t0 = now_ms();
    for (int i = 0; i < n_info; i++) ck(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo");
    printf("MEMINFO_US=%.3f\n", (now_ms() - t0) * 1e3 / n_info);
    return 0;
}

int main(int argc, char **argv) {
    double t_start = now_ms();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "bench")) return bench(t_start);
    if (cudaFree(0) != cudaSuccess) { fprintf(stderr, "no CUDA device\n"); return 3; }
    if (!strcmp(argv[1], "smshare")) return smshare(argc > 2 ? atoi(argv[2]) : 0);
    if (!strcmp(argv[1], "meminfo")) {
        size_t fr, tot;
        cudaMemGetInfo(&fr, &tot);
        printf("MEMINFO_TOTAL=%zu\nMEMINFO_FREE=%zu\n", tot, fr);
        return 0;
    }
    if (!strcmp(argv[1], "fill") && argc == 3) {
        size_t chunk = strtoull(argv[2], NULL, 10) << 20, total = 0;
        void *p;
        cudaError_t e;
        while ((e = cudaMalloc(&p, chunk)) == cudaSuccess) total += chunk;
        printf("ALLOC_TOTAL=%zu\nLAST_ERROR=%d\n", total, (int)e);
        return 0;
    }
    if (!strcmp(argv[1], "hold") && argc == 3) {
        void *p;
        printf("HELD=%d\n", cudaMalloc(&p, strtoull(argv[2], NULL, 10) << 20) == cudaSuccess);
        for (;;) pause();
    }
    if (!strcmp(argv[1], "spin") && argc == 3) {
        int *sink;
        cudaMalloc(&sink, sizeof(int));
        long long ns = 1000000;  // 1 ms
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        double t0 = now_s(), secs = atof(argv[2]);
        long long n = 0;
        while (now_s() - t0 < secs) {
            spin<<<sms, 64>>>(ns, sink);
            n++;
            if (n % 8 == 0) cudaDeviceSynchronize();
        }
        cudaDeviceSynchronize();
        printf("KERNELS=%lld\nELAPSED=%.3f\n", n, now_s() - t0);
        return 0;
    }
    return 2;
}
