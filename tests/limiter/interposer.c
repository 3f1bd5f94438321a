/*
 * interposer: a second preloaded library, loaded after libgpushare_limiter.so, that wraps puts()
 * the usual way, with dlsym(RTLD_NEXT, "puts"). The limiter's dlsym override must keep the
 * caller's identity for RTLD_NEXT: resolved relative to the limiter instead, RTLD_NEXT would
 * return this very wrapper and puts() would recurse until the stack overflows.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

int puts(const char *s) {
    static int (*real)(const char *);
    if (!real) real = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    if (!real || real == puts) return -1;
    static const char tag[] = "INTERPOSED=1\n";
    if (write(1, tag, sizeof tag - 1) < 0) return -1;
    return real(s);
}
