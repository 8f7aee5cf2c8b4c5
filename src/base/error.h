/* error.h - one table of error codes and a message buffer that names the problem.
 *
 * Every fallible function in cairn returns 0 (CN_OK) or a negative CN_E... code. Functions that can
 * fail for reasons a user must see (a missing tensor, a bad config field) also take a cn_err, whose
 * message names the thing at fault; cn_err_set() fills it and returns the code, so the idiom is
 *     return cn_err_set(err, CN_EFORMAT, "%s: header is not JSON", path);
 * A NULL cn_err is allowed everywhere: the code is still returned, the message dropped.
 * This module never allocates and never exits.
 */
#ifndef CN_ERROR_H
#define CN_ERROR_H

#include <stddef.h>

#define CN_ERRNO_MAP(XX)                                                        \
    XX(ENOMEM, -1, "out of memory")                                             \
    XX(EINVAL, -2, "invalid argument")                                          \
    XX(EIO, -3, "input/output error")                                           \
    XX(ENOENT, -4, "no such file")                                              \
    XX(EFORMAT, -5, "malformed file")                                           \
    XX(ETRUNC, -6, "file is truncated")                                         \
    XX(EDTYPE, -7, "unsupported dtype")                                         \
    XX(ENOTENSOR, -8, "missing tensor")                                         \
    XX(ESHAPE, -9, "tensor has the wrong shape")                                \
    XX(ECONFIG, -10, "missing or invalid config field")                         \
    XX(EBADMODEL, -11, "directory is not a NemotronH checkpoint")               \
    XX(ERANGE, -12, "value out of range")                                       \
    XX(ECONTEXT, -13, "prompt does not fit in the context")                     \
    XX(EUNSUPPORTED, -14, "operation not supported by this backend")            \
    XX(ECANCELED, -15, "operation canceled")                                    \
    XX(EBUSY, -16, "resource busy")                                             \
    XX(EUSAGE, -17, "usage error")

enum {
    CN_OK = 0,
#define XX(name, val, msg) CN_##name = val,
    CN_ERRNO_MAP(XX)
#undef XX
};

#define CN_ERR_MSG_MAX 512

typedef struct cn_err {
    int code;                 /* last code set, CN_OK if none */
    char msg[CN_ERR_MSG_MAX]; /* human message naming what failed */
} cn_err;

/* Returns the fixed description of a code ("unknown error" for unknown codes). */
const char *cn_strerror(int code);

/* Fills err (if not NULL) with code and a printf-style message; returns code. */
int cn_err_set(cn_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Resets err to CN_OK with an empty message. */
void cn_err_clear(cn_err *err);

#endif
