/* mapfile.h - read-only memory mapping of a whole file.
 *
 * Weights are mapped, never copied: a cn_mapfile owns one mapping for its lifetime. Opening fails
 * with CN_ENOENT (missing), CN_EIO (unreadable, not a regular file) naming the path in err.
 * An empty file maps to data == NULL, size == 0.
 */
#ifndef CN_MAPFILE_H
#define CN_MAPFILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct cn_mapfile {
    const uint8_t *data; /* mapping base, NULL when size == 0 */
    uint64_t size;       /* bytes */
} cn_mapfile;

/* Maps path read-only. On error, m is zeroed and the code returned. */
int cn_mapfile_open(cn_mapfile *m, const char *path, cn_err *err);
/* Unmaps; safe on a zeroed or already-closed map. */
void cn_mapfile_close(cn_mapfile *m);

#endif
