/*
 * foreign: an unrelated library that happens to export CUDA driver names (as some profilers,
 * shims and stubs do). A dlsym through its handle must return its own functions, and must not
 * make the limiter route the program's linked driver calls here.
 */
#include <stddef.h>

int cuMemAlloc_v2(unsigned long long *dptr, size_t size) {
    (void)size;
    if (dptr) *dptr = 0;
    return 77;
}

int cuMemFree_v2(unsigned long long ptr) {
    (void)ptr;
    return 77;
}
