/* readfile.c - see readfile.h. */
#include "base/readfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cn_read_file(const char *path, char **text, size_t *len, cn_err *err) {
    *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int code = errno == ENOENT ? CN_ENOENT : CN_EIO;
        return cn_err_set(err, code, "%s: %s", path, strerror(errno));
    }
    int rc = CN_OK;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        rc = cn_err_set(err, CN_EIO, "%s: read error", path);
        goto done;
    }
    buf[n] = '\0';
    *text = buf;
    if (len) *len = n;
    buf = NULL;
done:
    free(buf);
    fclose(f);
    return rc;
}
