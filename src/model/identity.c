/* identity.c - a 64-bit fingerprint of a checkpoint, so cached state is never loaded into a model
 * it was not computed by.
 *
 * xxh64 over config.json's bytes, then over every tensor in name order: name, dtype, shape, byte
 * count and the first and last 64 bytes of its data. Sampling keeps it cheap on a 60 GB
 * checkpoint (a few pages per tensor), while two seeds of one synthetic preset, or two fine-tunes
 * of one architecture, still differ: any change of weights touches the sampled bytes of some
 * tensor with overwhelming likelihood, and a retrained model changes all of them. The order of
 * shards and of tensors inside a file does not matter.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "model/model.h"
#include "model/safetensors.h"

#define SAMPLE 64

static int by_name(const void *a, const void *b) {
    const cn_st_tensor *x = *(const cn_st_tensor *const *)a, *y = *(const cn_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static void put_u64(XXH64_state_t *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH64_update(h, b, sizeof b);
}

/* Hashes config.json and the tensors of st. */
int cn_model_identity_of(const char *dir, const cn_safetensors *st, uint64_t *out, cn_err *err) {
    int rc = CN_OK, n = cn_st_count(st);
    char *path = NULL;
    uint8_t *cfg = NULL;
    FILE *f = NULL;
    const cn_st_tensor **ts = malloc((size_t)(n ? n : 1) * sizeof *ts);
    XXH64_state_t *h = XXH64_createState();
    size_t plen = strlen(dir) + sizeof "/config.json";
    path = malloc(plen);
    if (!ts || !h || !path) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto done;
    }
    snprintf(path, plen, "%s/config.json", dir);
    f = fopen(path, "rb");
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (!f || len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = cn_err_set(err, CN_EIO, "%s: cannot read", path);
        goto done;
    }
    cfg = malloc((size_t)len + 1);
    if (!cfg) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto done;
    }
    if (fread(cfg, 1, (size_t)len, f) != (size_t)len) {
        rc = cn_err_set(err, CN_EIO, "%s: cannot read", path);
        goto done;
    }
    XXH64_reset(h, 0x636169726e4d4944ull); /* "cairnMID" */
    put_u64(h, (uint64_t)len);
    XXH64_update(h, cfg, (size_t)len);
    for (int i = 0; i < n; i++) ts[i] = cn_st_at(st, i);
    qsort(ts, (size_t)n, sizeof *ts, by_name);
    for (int i = 0; i < n; i++) {
        const cn_st_tensor *t = ts[i];
        const uint8_t *d = t->data;
        XXH64_update(h, t->name, strlen(t->name) + 1);
        put_u64(h, (uint64_t)t->dtype);
        put_u64(h, (uint64_t)t->ndim);
        for (int k = 0; k < t->ndim; k++) put_u64(h, (uint64_t)t->shape[k]);
        put_u64(h, t->nbytes);
        uint64_t s = t->nbytes < SAMPLE ? t->nbytes : SAMPLE;
        if (s) {
            XXH64_update(h, d, (size_t)s);
            XXH64_update(h, d + t->nbytes - s, (size_t)s);
        }
    }
    *out = XXH64_digest(h);
done:
    if (f) fclose(f);
    free(cfg);
    free(path);
    free(ts);
    if (h) XXH64_freeState(h);
    return rc;
}

int cn_model_identity_dir(const char *dir, uint64_t *out, cn_err *err) {
    cn_safetensors *st;
    int rc = cn_st_open_dir(&st, dir, err);
    if (rc) return rc;
    rc = cn_model_identity_of(dir, st, out, err);
    cn_st_close(st);
    return rc;
}
