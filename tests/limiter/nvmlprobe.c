/*
 * nvmlprobe: checks the NVML side of the TEST-ONLY simulated driver (the contract the hook
 * core relies on). Prints KEY=VALUE lines.
 *   nvmlprobe show        everything about every device
 *   nvmlprobe set I MODE  nvmlDeviceSetComputeMode(I, MODE)
 */
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    unsigned n = 0;
    nvmlDevice_t d;
    char buf[96];
    printf("PRE_INIT_RC=%d\n", nvmlDeviceGetCount_v2(&n));
    int r = nvmlInit_v2();
    printf("INIT_RC=%d\n", r);
    if (r) return 0;
    if (argc == 4 && !strcmp(argv[1], "set")) {
        nvmlDeviceGetHandleByIndex_v2(atoi(argv[2]), &d);
        printf("SET_RC=%d\n", nvmlDeviceSetComputeMode(d, atoi(argv[3])));
        return nvmlShutdown();
    }
    nvmlDeviceGetCount_v2(&n);
    printf("COUNT=%u\n", n);
    for (unsigned i = 0; i < n; i++) {
        unsigned idx = 99, minor = 99, mode = 99;
        nvmlMemory_t m;
        nvmlPciInfo_t pci;
        nvmlDeviceGetHandleByIndex_v2(i, &d);
        nvmlDeviceGetUUID(d, buf, sizeof buf); printf("UUID%u=%s\n", i, buf);
        nvmlDevice_t byuuid;
        printf("BYUUID%u_SAME=%d\n", i, nvmlDeviceGetHandleByUUID(buf, &byuuid) == 0 && byuuid == d);
        nvmlDeviceGetName(d, buf, sizeof buf); printf("NAME%u=%s\n", i, buf);
        nvmlDeviceGetIndex(d, &idx); printf("INDEX%u=%u\n", i, idx);
        nvmlDeviceGetMinorNumber(d, &minor); printf("MINOR%u=%u\n", i, minor);
        nvmlDeviceGetComputeMode(d, &mode); printf("MODE%u=%u\n", i, mode);
        nvmlDeviceGetMemoryInfo(d, &m); printf("TOTAL%u=%llu\n", i, m.total);
        nvmlDeviceGetPciInfo_v3(d, &pci); printf("PCI%u=%s\n", i, pci.busId);
        nvmlDevice_t bypci;
        printf("BYPCI%u_SAME=%d\n", i, nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &bypci) == 0 && bypci == d);
    }
    printf("BAD_INDEX_RC=%d\n", nvmlDeviceGetHandleByIndex_v2(n, &d));
    nvmlDeviceGetHandleByIndex_v2(0, &d);
    printf("SMALL_BUF_RC=%d\n", nvmlDeviceGetUUID(d, buf, 8));
    printf("BAD_HANDLE_RC=%d\n", nvmlDeviceGetUUID((nvmlDevice_t)buf, buf, sizeof buf));
    nvmlSystemGetDriverVersion(buf, sizeof buf); printf("DRIVER=%s\n", buf);
    int cv = 0; nvmlSystemGetCudaDriverVersion(&cv); printf("CUDA_VERSION=%d\n", cv);
    printf("ERRSTR=%s\n", nvmlErrorString(NVML_ERROR_INSUFFICIENT_SIZE));
    printf("SHUTDOWN_RC=%d\n", nvmlShutdown());
    printf("AFTER_SHUTDOWN_RC=%d\n", nvmlDeviceGetCount_v2(&n));
    return 0;
}
