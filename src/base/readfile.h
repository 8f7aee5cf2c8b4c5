/* readfile.h - a whole small file (JSON, a token list) into memory.
 *
 * For files that are parsed, not mapped: weights go through mapfile.h and are never copied.
 * Errors name the path: CN_ENOENT (missing), CN_EIO (unreadable), CN_ENOMEM.
 */
#ifndef CN_READFILE_H
#define CN_READFILE_H

#include <stddef.h>

#include "base/error.h"

/* Reads path into a NUL-terminated malloc'd buffer *text (caller frees), its length in *len when
 * len is not NULL. On error *text is NULL and the code is returned. */
int cn_read_file(const char *path, char **text, size_t *len, cn_err *err);

#endif
