/* meminfo.h - how much host memory there is and how much a process could still take.
 *
 * Reads MemAvailable and MemTotal from /proc/meminfo (the kernel's estimate of what can be
 * allocated without swapping, reclaimable page cache included); where that file is missing, the
 * free and physical pages sysconf reports. Never allocates and keeps no state.
 */
#ifndef CN_MEMINFO_H
#define CN_MEMINFO_H

#include <stdint.h>

/* Fills *avail and *total (bytes). Returns 0, or CN_EUNSUPPORTED (both 0) when neither source
 * answers. */
int cn_host_memory(uint64_t *avail, uint64_t *total);

#endif
