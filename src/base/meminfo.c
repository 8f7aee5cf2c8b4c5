/* meminfo.c - host memory figures; see meminfo.h. */
#include "base/meminfo.h"

#include <stdio.h>
#include <unistd.h>

#include "base/error.h"

int cn_host_memory(uint64_t *avail, uint64_t *total) {
    unsigned long long a = 0, t = 0, kb;
    int got = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && got != 3 && fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) a = kb << 10, got |= 1;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) t = kb << 10, got |= 2;
    }
    if (f) fclose(f);
    if (got != 3) { /* an old kernel (no MemAvailable) or no /proc: free pages undercount, safely */
        long pg = sysconf(_SC_PAGESIZE), av = sysconf(_SC_AVPHYS_PAGES), ph = sysconf(_SC_PHYS_PAGES);
        if (pg <= 0 || av < 0 || ph <= 0) {
            *avail = *total = 0;
            return CN_EUNSUPPORTED;
        }
        a = (unsigned long long)av * (unsigned long long)pg;
        t = (unsigned long long)ph * (unsigned long long)pg;
    }
    *avail = a;
    *total = t;
    return CN_OK;
}
