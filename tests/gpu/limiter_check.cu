// GPU validation program for libgpushare_limiter.so (real GPU only; see validate-limiter.sh).
// Built with Debian's nvidia-cuda-toolkit: nvcc -O2 -o limiter_check limiter_check.cu
// The CUDA runtime reaches the driver through cuGetProcAddress, so this exercises that path.
//   limiter_check meminfo            print MEMINFO_TOTAL / MEMINFO_FREE
//   limiter_check fill CHUNK_MIB     cudaMalloc chunks until failure, print ALLOC_TOTAL
//   limiter_check hold MIB           cudaMalloc MIB, print HELD=1, sleep until killed
//   limiter_check spin SECONDS       launch ~1 ms kernels for SECONDS, print KERNELS/ELAPSED
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__global__ void spin(long long cycles, int *sink) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(sink, 1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 2;
    if (cudaFree(0) != cudaSuccess) { fprintf(stderr, "no CUDA device\n"); return 3; }
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
        int clock_khz = 0;
        cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
        long long cycles = (long long)clock_khz;  // ~1 ms
        int sms = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
        double t0 = now_s(), secs = atof(argv[2]);
        long long n = 0;
        while (now_s() - t0 < secs) {
            spin<<<sms, 64>>>(cycles, sink);
            n++;
            if (n % 8 == 0) cudaDeviceSynchronize();
        }
        cudaDeviceSynchronize();
        printf("KERNELS=%lld\nELAPSED=%.3f\n", n, now_s() - t0);
        return 0;
    }
    return 2;
}
