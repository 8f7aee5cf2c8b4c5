/* error.c - the code table and the message buffer; see error.h. */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

const char *cn_strerror(int code) {
    switch (code) {
    case CN_OK: return "success";
#define XX(name, val, msg) case CN_##name: return msg;
    CN_ERRNO_MAP(XX)
#undef XX
    default: return "unknown error";
    }
}

int cn_err_set(cn_err *err, int code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void cn_err_clear(cn_err *err) {
    if (!err) return;
    err->code = CN_OK;
    err->msg[0] = '\0';
}
