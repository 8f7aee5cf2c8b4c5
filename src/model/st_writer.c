/* st_writer.c - streaming safetensors writer; see st_writer.h.
 *
 * Never holds tensor data beyond one CN_ST_CHUNK buffer, never leaves a partial file under a final
 * name, and checks every fwrite/fflush/fclose/rename, because a full disk shows up only there.
 */
#include "model/st_writer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct st_decl {
    char *name;                 /* owned */
    cn_dtype dtype;
    int ndim;                   /* 0 = scalar */
    int64_t shape[CN_MAX_DIMS];
    uint64_t nbytes;
    int shard;                  /* set by plan() */
} st_decl;

struct cn_st_writer {
    st_decl *t;   /* [n] in declaration order */
    int n, cap;
    int *slots;   /* [nslots] open-addressing name index into t, -1 empty; nslots a power of 2 */
    int nslots;
    uint64_t total;
};

/* ---- growable text buffer ------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom; /* sticky: set once an append failed, so callers check once at the end */
} sbuf;

static void sb_reserve(sbuf *b, size_t extra) {
    if (b->oom || b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t n) {
    sb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_puts(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        sb_put(b, tmp, (size_t)n);
        return;
    }
    sb_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

/* ---- declarations --------------------------------------------------------------------------- */

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Slot holding name, or the empty slot where it would go. */
static int find_slot(const cn_st_writer *w, const char *name) {
    size_t mask = (size_t)w->nslots - 1, i = (size_t)name_hash(name) & mask;
    while (w->slots[i] >= 0 && strcmp(w->t[w->slots[i]].name, name) != 0) i = (i + 1) & mask;
    return (int)i;
}

static int rehash(cn_st_writer *w, int nslots) {
    int *slots = malloc((size_t)nslots * sizeof *slots);
    if (!slots) return CN_ENOMEM;
    for (int i = 0; i < nslots; i++) slots[i] = -1;
    free(w->slots);
    w->slots = slots;
    w->nslots = nslots;
    for (int i = 0; i < w->n; i++) w->slots[find_slot(w, w->t[i].name)] = i;
    return CN_OK;
}

int cn_st_writer_new(cn_st_writer **out, cn_err *err) {
    cn_st_writer *w = calloc(1, sizeof *w);
    if (!w || rehash(w, 64) != CN_OK) {
        free(w);
        return cn_err_set(err, CN_ENOMEM, "safetensors writer: out of memory");
    }
    *out = w;
    return CN_OK;
}

void cn_st_writer_free(cn_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    free(w->slots);
    free(w);
}

int cn_st_writer_add(cn_st_writer *w, const char *name, cn_dtype dtype, int ndim,
                     const int64_t *shape, cn_err *err) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return cn_err_set(err, CN_EINVAL, "safetensors writer: bad tensor name '%s'",
                          name ? name : "(null)");
    if (ndim < 0 || ndim > CN_MAX_DIMS)
        return cn_err_set(err, CN_EINVAL, "%s: rank %d out of range", name, ndim);
    size_t esz = cn_dtype_size(dtype);
    if ((unsigned)dtype >= CN_DTYPE_COUNT || esz == 0 || dtype == CN_MXFP8)
        return cn_err_set(err, CN_EINVAL, "%s: dtype %s cannot be stored directly", name,
                          cn_dtype_name(dtype));
    uint64_t nbytes = esz;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return cn_err_set(err, CN_EINVAL, "%s: negative dimension", name);
        nbytes *= (uint64_t)shape[d];
    }
    if (w->t && w->slots[find_slot(w, name)] >= 0)
        return cn_err_set(err, CN_EINVAL, "%s: tensor declared twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 64;
        st_decl *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", name);
        w->t = t;
        w->cap = cap;
    }
    /* Keep the load factor at or under 1/2 so probes stay short. */
    if (2 * (w->n + 1) > w->nslots && rehash(w, w->nslots * 2) != CN_OK)
        return cn_err_set(err, CN_ENOMEM, "%s: out of memory", name);
    char *copy = strdup(name);
    if (!copy) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", name);
    st_decl *d = &w->t[w->n];
    memset(d, 0, sizeof *d);
    d->name = copy;
    d->dtype = dtype;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->nbytes = nbytes;
    w->slots[find_slot(w, name)] = w->n;
    w->n++;
    w->total += nbytes;
    return CN_OK;
}

int cn_st_writer_count(const cn_st_writer *w) { return w->n; }
uint64_t cn_st_writer_total_bytes(const cn_st_writer *w) { return w->total; }

/* Greedy shard assignment in declaration order (invariant 1); stores each tensor's shard in
 * shard_of[i] when not NULL and returns the number of shards. */
static int shard_walk(const st_decl *t, int n, uint64_t max, int *shard_of) {
    int shard = 0;
    uint64_t used = 0;
    for (int i = 0; i < n; i++) {
        if (max && used > 0 && used + t[i].nbytes > max) {
            shard++;
            used = 0;
        }
        if (shard_of) shard_of[i] = shard;
        used += t[i].nbytes;
    }
    return shard + 1;
}

int cn_st_writer_plan(const cn_st_writer *w, uint64_t max_shard_bytes) {
    return shard_walk(w->t, w->n, max_shard_bytes, NULL);
}

/* File order: by shard, then element size descending (invariant 2), then declaration order. */
static int order_cmp(const st_decl *t, int a, int b) {
    if (t[a].shard != t[b].shard) return t[a].shard < t[b].shard ? -1 : 1;
    size_t ea = cn_dtype_size(t[a].dtype), eb = cn_dtype_size(t[b].dtype);
    if (ea != eb) return ea > eb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Bottom-up merge sort of idx by order_cmp (qsort would need the table in a global). */
static int sort_order(const st_decl *t, int *idx, int n) {
    int *tmp = malloc((n > 0 ? (size_t)n : 1) * sizeof *tmp);
    if (!tmp) return CN_ENOMEM;
    for (int width = 1; width < n; width *= 2) {
        for (int lo = 0; lo < n; lo += 2 * width) {
            int mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = order_cmp(t, idx[i], idx[j]) <= 0 ? idx[i++] : idx[j++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
    free(tmp);
    return CN_OK;
}

/* Header JSON for tensors idx[0..n), offsets from 0, padded with spaces to a multiple of 8. */
static int build_header(sbuf *b, const st_decl *t, const int *idx, int n) {
    uint64_t off = 0;
    sb_puts(b, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int k = 0; k < n; k++) {
        const st_decl *d = &t[idx[k]];
        sb_puts(b, ",");
        sb_json_str(b, d->name);
        sb_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", cn_dtype_name(d->dtype));
        for (int i = 0; i < d->ndim; i++) sb_printf(b, "%s%lld", i ? "," : "", (long long)d->shape[i]);
        sb_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                  (unsigned long long)(off + d->nbytes));
        off += d->nbytes;
    }
    sb_puts(b, "}");
    while (!b->oom && b->len % 8) sb_puts(b, " ");
    return b->oom ? CN_ENOMEM : CN_OK;
}

static char *path_join(const char *dir, const char *name, const char *suffix) {
    size_t n = strlen(dir) + strlen(name) + strlen(suffix) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s%s", dir, name, suffix);
    return p;
}

static int io_error(cn_err *err, const char *path, const char *what) {
    return cn_err_set(err, CN_EIO, "%s: %s: %s", path, what, strerror(errno ? errno : EIO));
}

/* Writes one shard (tensors idx[0..n)) to path; the caller removes path on error. */
static int write_shard(const char *path, const st_decl *t, const int *idx, int n,
                       cn_st_fill_fn fill, void *ctx, unsigned char *buf, cn_err *err) {
    sbuf hdr = {0};
    FILE *f = NULL;
    int rc = build_header(&hdr, t, idx, n);
    if (rc != CN_OK) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory building the header", path);
        goto done;
    }
    errno = 0;
    f = fopen(path, "wb");
    if (!f) {
        rc = io_error(err, path, "cannot create");
        goto done;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hdr.len >> (8 * i));
    if (fwrite(len8, 1, 8, f) != 8 || fwrite(hdr.p, 1, hdr.len, f) != hdr.len) {
        rc = io_error(err, path, "write failed");
        goto done;
    }
    for (int k = 0; k < n; k++) {
        const st_decl *d = &t[idx[k]];
        for (uint64_t off = 0; off < d->nbytes; off += CN_ST_CHUNK) {
            uint64_t len = d->nbytes - off < CN_ST_CHUNK ? d->nbytes - off : CN_ST_CHUNK;
            cn_err_clear(err); /* so that a message the callback leaves is told from none */
            rc = fill(ctx, idx[k], d->name, off, buf, len);
            if (rc != CN_OK) {
                char why[CN_ERR_MSG_MAX];
                snprintf(why, sizeof why, "%s",
                         err && err->code == rc && err->msg[0] ? err->msg : cn_strerror(rc));
                cn_err_set(err, rc, "%s: producing tensor %s failed: %s", path, d->name, why);
                goto done;
            }
            errno = 0;
            if (fwrite(buf, 1, (size_t)len, f) != (size_t)len) {
                rc = io_error(err, path, "write failed");
                goto done;
            }
        }
    }
    errno = 0;
    if (fflush(f) != 0 || ferror(f)) {
        rc = io_error(err, path, "write failed");
        goto done;
    }
    FILE *g = f;
    f = NULL;
    errno = 0;
    if (fclose(g) != 0) rc = io_error(err, path, "close failed");
done:
    if (f) fclose(f);
    free(hdr.p);
    return rc;
}

int cn_write_file_atomic(const char *path, const void *data, size_t len, cn_err *err) {
    size_t n = strlen(path) + sizeof ".tmp";
    char *tmp = malloc(n);
    if (!tmp) return cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
    snprintf(tmp, n, "%s.tmp", path);
    int rc = CN_OK;
    errno = 0;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        rc = io_error(err, tmp, "cannot create");
        goto done;
    }
    errno = 0;
    int bad = fwrite(data, 1, len, f) != len;
    bad |= fflush(f) != 0;
    if (bad) {
        rc = io_error(err, tmp, "write failed");
        fclose(f);
        goto done;
    }
    errno = 0;
    if (fclose(f) != 0) {
        rc = io_error(err, tmp, "close failed");
        goto done;
    }
    errno = 0;
    if (rename(tmp, path) != 0) rc = io_error(err, path, "rename failed");
done:
    if (rc != CN_OK) unlink(tmp);
    free(tmp);
    return rc;
}

static int write_index(const char *dir, const cn_st_writer *w, char **names, cn_err *err) {
    sbuf b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {",
              (unsigned long long)w->total);
    for (int i = 0; i < w->n; i++) {
        sb_puts(&b, i ? ",\n    " : "\n    ");
        sb_json_str(&b, w->t[i].name);
        sb_puts(&b, ": ");
        sb_json_str(&b, names[w->t[i].shard]);
    }
    sb_puts(&b, "\n  }\n}\n");
    char *path = path_join(dir, "model.safetensors.index.json", "");
    int rc;
    if (b.oom || !path) rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", dir);
    else rc = cn_write_file_atomic(path, b.p, b.len, err);
    free(path);
    free(b.p);
    return rc;
}

static int oom_error(cn_err *err, const char *dir) {
    return cn_err_set(err, CN_ENOMEM, "%s: out of memory writing safetensors", dir);
}

int cn_st_writer_write(cn_st_writer *w, const char *dir, uint64_t max_shard_bytes,
                       cn_st_fill_fn fill, void *ctx, cn_err *err) {
    int rc = CN_OK, nshards = cn_st_writer_plan(w, max_shard_bytes), written = 0;
    char *other = NULL; /* the other layout's top-level file, removed on success */
    int *idx = malloc((w->n > 0 ? (size_t)w->n : 1) * sizeof *idx);
    unsigned char *buf = malloc(CN_ST_CHUNK);
    char **names = calloc((size_t)nshards, sizeof *names);
    char **finals = calloc((size_t)nshards, sizeof *finals);
    char **tmps = calloc((size_t)nshards, sizeof *tmps);
    if (!idx || !buf || !names || !finals || !tmps) {
        rc = oom_error(err, dir);
        goto done;
    }
    for (int s = 0; s < nshards; s++) {
        char name[64];
        if (nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        names[s] = strdup(name);
        finals[s] = path_join(dir, name, "");
        tmps[s] = path_join(dir, name, ".tmp");
        if (!names[s] || !finals[s] || !tmps[s]) {
            rc = oom_error(err, dir);
            goto done;
        }
    }
    shard_walk(w->t, w->n, max_shard_bytes, idx);
    for (int i = 0; i < w->n; i++) w->t[i].shard = idx[i];
    for (int i = 0; i < w->n; i++) idx[i] = i;
    if (sort_order(w->t, idx, w->n) != CN_OK) {
        rc = oom_error(err, dir);
        goto done;
    }

    for (int s = 0, k = 0; s < nshards; s++) {
        int k0 = k;
        while (k < w->n && w->t[idx[k]].shard == s) k++;
        written = s + 1; /* a failed shard may have left its temporary behind */
        rc = write_shard(tmps[s], w->t, idx + k0, k - k0, fill, ctx, buf, err);
        if (rc != CN_OK) goto done;
    }
    for (int s = 0; s < nshards; s++) {
        errno = 0;
        if (rename(tmps[s], finals[s]) != 0) {
            rc = io_error(err, finals[s], "rename failed");
            goto done;
        }
    }
    written = 0;
    other = path_join(dir, nshards > 1 ? "model.safetensors" : "model.safetensors.index.json", "");
    if (!other) {
        rc = oom_error(err, dir);
        goto done;
    }
    if (nshards > 1) rc = write_index(dir, w, names, err);
    if (rc == CN_OK) unlink(other); /* invariant (4); absent is fine */
done:
    free(other);
    for (int s = 0; s < written; s++) unlink(tmps[s]);
    for (int s = 0; s < nshards && names; s++) free(names[s]);
    for (int s = 0; s < nshards && finals; s++) free(finals[s]);
    for (int s = 0; s < nshards && tmps; s++) free(tmps[s]);
    free(names);
    free(finals);
    free(tmps);
    free(buf);
    free(idx);
    return rc;
}
