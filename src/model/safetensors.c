/* safetensors.c - mapped safetensors files, their headers checked, and a name index; see
 * safetensors.h.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *     {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 *      "__metadata__": {...}}
 * then the data buffer; offsets are relative to its start (byte 8 + N).
 *
 * Promises:
 *  (1) Every tensor accepted has a known dtype, ndim <= CN_MAX_DIMS, non-negative dims, and
 *      end - begin == product(shape) * dtype size, all computed in 64 bits with overflow checks,
 *      with [begin, end) inside the data buffer of its own file; no two tensors of a file overlap.
 *  (2) Names are unique over all shards; lookup is an open-addressing FNV-1a table.
 *  (3) In directory mode every weight_map entry exists in the shard it names, and shard names
 *      cannot leave the directory.
 * Errors read "<file>: tensor '<name>': <what is wrong>" (or "<file>: <what>" for the file).
 * Never: copies tensor data, keeps the header JSON after opening, or aligns data (a tensor's
 * address is whatever the file gives; consumers that need alignment check it).
 */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/mapfile.h"

struct cn_safetensors {
    int n_files;
    cn_mapfile *maps;    /* [n_files] */
    char **paths;        /* [n_files] owned */
    int n_tensors, cap_tensors;
    cn_st_tensor *tensors; /* [n_tensors]; names owned */
    uint32_t *slots;     /* [n_slots] tensor index + 1, 0 = empty; n_slots a power of two */
    uint32_t n_slots;
};

/* ---------------------------------------------------------------------------------------------
 * Name index
 * ------------------------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Slot holding name, or the empty slot where it would go. */
static uint32_t slot_of(const cn_safetensors *st, const char *name) {
    uint32_t mask = st->n_slots - 1, i = (uint32_t)fnv1a(name) & mask;
    while (st->slots[i] && strcmp(st->tensors[st->slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* Keeps the load factor at or below 1/2 so probes stay short. */
static int index_reserve(cn_safetensors *st, int n) {
    if ((uint64_t)n * 2 <= st->n_slots) return CN_OK;
    uint32_t ns = st->n_slots ? st->n_slots : 64;
    while ((uint64_t)n * 2 > ns) ns *= 2;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (!slots) return CN_ENOMEM;
    uint32_t *old = st->slots;
    st->slots = slots;
    st->n_slots = ns;
    for (int k = 0; k < st->n_tensors; k++)
        st->slots[slot_of(st, st->tensors[k].name)] = (uint32_t)k + 1;
    free(old);
    return CN_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Header parsing
 * ------------------------------------------------------------------------------------------- */

/* A JSON number that is a whole value in [0, 2^53] (exact in a double), as u64. */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!isfinite(v) || v < 0 || v != floor(v) || v > 9007199254740992.0) return 0;
    *out = (uint64_t)v;
    return 1;
}

static void shape_str(const cn_st_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Fills t (but not name/file/data) from one header entry; checks (1) except overlap. */
static int parse_entry(const char *path, const char *name, const cJSON *e, uint64_t data_size,
                       cn_st_tensor *t, uint64_t *begin, cn_err *err) {
    if (!cJSON_IsObject(e))
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': header entry is not an object", path,
                          name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': dtype is %s", path, name,
                          dt ? "not a string" : "missing");
    if (cn_dtype_parse(dt->valuestring, &t->dtype) != CN_OK)
        return cn_err_set(err, CN_EDTYPE, "%s: tensor '%s': unknown dtype '%s'", path, name,
                          dt->valuestring);
    if (!cJSON_IsArray(sh))
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': shape is %s", path, name,
                          sh ? "not a list" : "missing");
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > CN_MAX_DIMS)
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': %d dimensions, at most %d supported",
                          path, name, ndim, CN_MAX_DIMS);
    t->ndim = ndim;
    uint64_t nelem = 1;
    int overflow = 0;
    for (int i = 0; i < CN_MAX_DIMS; i++) t->shape[i] = 1;
    for (int i = 0; i < ndim; i++) {
        const cJSON *d = cJSON_GetArrayItem(sh, i);
        uint64_t v;
        if (!json_u64(d, &v) || v > (uint64_t)INT64_MAX) {
            if (cJSON_IsNumber(d))
                return cn_err_set(err, CN_EFORMAT,
                                  "%s: tensor '%s': shape[%d] = %g is not a non-negative integer",
                                  path, name, i, d->valuedouble);
            return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': shape[%d] is not a number", path,
                              name, i);
        }
        t->shape[i] = (int64_t)v;
        if (v != 0 && nelem > UINT64_MAX / v) overflow = 1;
        else nelem *= v;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': data_offsets is %s", path, name,
                          !off ? "missing" : "not a list of two offsets");
    uint64_t b, en;
    if (!json_u64(cJSON_GetArrayItem(off, 0), &b) || !json_u64(cJSON_GetArrayItem(off, 1), &en))
        return cn_err_set(err, CN_EFORMAT,
                          "%s: tensor '%s': data_offsets must be two non-negative integers", path,
                          name);
    if (en < b)
        return cn_err_set(err, CN_EFORMAT,
                          "%s: tensor '%s': data_offsets end %llu is before begin %llu", path,
                          name, (unsigned long long)en, (unsigned long long)b);
    if (en > data_size)
        return cn_err_set(err, CN_ETRUNC,
                          "%s: tensor '%s': data_offsets end %llu is past the data buffer of "
                          "%llu bytes", path, name, (unsigned long long)en,
                          (unsigned long long)data_size);
    uint64_t esize = cn_dtype_size(t->dtype);
    char sbuf[128];
    shape_str(t, sbuf, sizeof sbuf);
    if (overflow || (esize && nelem > UINT64_MAX / esize))
        return cn_err_set(err, CN_EFORMAT, "%s: tensor '%s': shape %s is too large", path, name,
                          sbuf);
    t->nbytes = en - b;
    if (t->nbytes != nelem * esize)
        return cn_err_set(err, CN_EFORMAT,
                          "%s: tensor '%s': data_offsets span %llu bytes but shape %s of %s "
                          "needs %llu", path, name, (unsigned long long)t->nbytes, sbuf,
                          dt->valuestring, (unsigned long long)(nelem * esize));
    *begin = b;
    return CN_OK;
}

typedef struct span {
    uint64_t begin, end;
    int tensor;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Appends the tensors of file index fi (already mapped) to st. */
static int parse_file(cn_safetensors *st, int fi, cn_err *err) {
    const char *path = st->paths[fi];
    const uint8_t *p = st->maps[fi].data;
    uint64_t size = st->maps[fi].size;
    if (size < 8)
        return cn_err_set(err, CN_ETRUNC,
                          "%s: %llu bytes, too short for the 8-byte header length", path,
                          (unsigned long long)size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > size - 8)
        return cn_err_set(err, CN_ETRUNC, "%s: header length %llu is past the end of the %llu-byte "
                          "file", path, (unsigned long long)hlen, (unsigned long long)size);
    const char *hdr = (const char *)p + 8;
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;

    int rc = CN_OK;
    span *spans = NULL;
    int n_spans = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (!root) {
        rc = cn_err_set(err, CN_EFORMAT, "%s: header is not JSON (near byte %lld of %llu)", path,
                        end ? (long long)(end - hdr) : -1LL, (unsigned long long)hlen);
        goto done;
    }
    /* Writers pad the header with spaces for alignment; anything else after the JSON is junk. */
    for (const char *q = end; q < hdr + hlen; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != '\0') {
            rc = cn_err_set(err, CN_EFORMAT, "%s: header has junk after the JSON at byte %lld",
                            path, (long long)(q - hdr));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        rc = cn_err_set(err, CN_EFORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    int n = cJSON_GetArraySize(root);
    if (st->n_tensors + n > st->cap_tensors) {
        int cap = st->cap_tensors ? st->cap_tensors : 64;
        while (cap < st->n_tensors + n) cap *= 2;
        cn_st_tensor *nt = realloc(st->tensors, (size_t)cap * sizeof *nt);
        if (!nt) {
            rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        st->tensors = nt;
        st->cap_tensors = cap;
    }
    if (index_reserve(st, st->n_tensors + n) != CN_OK ||
        !(spans = malloc((size_t)(n ? n : 1) * sizeof *spans))) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *name = e->string;
        if (!strcmp(name, "__metadata__")) continue; /* free-form strings; nothing to check */
        cn_st_tensor t;
        memset(&t, 0, sizeof t);
        uint64_t begin = 0;
        if ((rc = parse_entry(path, name, e, data_size, &t, &begin, err))) goto done;
        uint32_t slot = slot_of(st, name);
        if (st->slots[slot]) {
            const cn_st_tensor *o = &st->tensors[st->slots[slot] - 1];
            if (o->file == fi)
                rc = cn_err_set(err, CN_EFORMAT, "%s: tensor '%s' is listed twice in the header",
                                path, name);
            else
                rc = cn_err_set(err, CN_EFORMAT, "%s: tensor '%s' is also in %s", path, name,
                                st->paths[o->file]);
            goto done;
        }
        char *copy = strdup(name);
        if (!copy) {
            rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        t.name = copy;
        t.file = fi;
        t.data = data + begin;
        st->tensors[st->n_tensors] = t;
        st->slots[slot] = (uint32_t)++st->n_tensors;
        /* Empty tensors occupy no bytes and cannot overlap anything. */
        if (t.nbytes) spans[n_spans++] = (span){begin, begin + t.nbytes, st->n_tensors - 1};
    }
    qsort(spans, (size_t)n_spans, sizeof *spans, span_cmp);
    for (int i = 1; i < n_spans; i++)
        if (spans[i].begin < spans[i - 1].end) {
            rc = cn_err_set(err, CN_EFORMAT,
                            "%s: tensor '%s' [%llu, %llu) overlaps tensor '%s' [%llu, %llu)", path,
                            st->tensors[spans[i].tensor].name, (unsigned long long)spans[i].begin,
                            (unsigned long long)spans[i].end,
                            st->tensors[spans[i - 1].tensor].name,
                            (unsigned long long)spans[i - 1].begin,
                            (unsigned long long)spans[i - 1].end);
            goto done;
        }
done:
    free(spans);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Opening
 * ------------------------------------------------------------------------------------------- */

static cn_safetensors *st_new(int n_files) {
    cn_safetensors *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    /* Zeroed maps and NULL paths are safe to close, so n_files is the full count at once. */
    st->n_files = n_files;
    st->maps = calloc((size_t)n_files, sizeof *st->maps);
    st->paths = calloc((size_t)n_files, sizeof *st->paths);
    if (!st->maps || !st->paths) {
        cn_st_close(st);
        return NULL;
    }
    return st;
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Maps and parses the files whose paths are already in st->paths. */
static int open_all(cn_safetensors *st, int n_files, cn_err *err) {
    for (int i = 0; i < n_files; i++) {
        int rc = cn_mapfile_open(&st->maps[i], st->paths[i], err);
        if (rc) return rc;
        if ((rc = parse_file(st, i, err))) return rc;
    }
    return CN_OK;
}

int cn_st_open_file(cn_safetensors **out, const char *path, cn_err *err) {
    int rc;
    cn_safetensors *st = st_new(1);
    if (!st || !(st->paths[0] = strdup(path))) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if ((rc = open_all(st, 1, err))) goto fail;
    *out = st;
    return CN_OK;
fail:
    cn_st_close(st);
    return rc;
}

static int file_exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

/* A shard name from the index must name a file directly in the directory. */
static int shard_name_ok(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Reads the index JSON and checks that weight_map is an object; *out is the parsed root. */
static int read_index(const char *path, cJSON **out, cn_err *err) {
    cn_mapfile m;
    *out = NULL;
    int rc = cn_mapfile_open(&m, path, err);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength((const char *)m.data, (size_t)m.size);
    cn_mapfile_close(&m);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return cn_err_set(err, CN_EFORMAT, "%s: not a JSON object", path);
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return cn_err_set(err, CN_EFORMAT, "%s: weight_map is %s", path,
                          wm ? "not an object" : "missing");
    }
    *out = root;
    return CN_OK;
}

static int open_index(cn_safetensors **out, const char *dir, const char *index_path,
                      cn_err *err) {
    cn_safetensors *st = NULL;
    cJSON *root = NULL;
    const char **shards = NULL; /* distinct shard names, borrowed from root */
    int n_shards = 0, rc = read_index(index_path, &root, err);
    if (rc) goto fail;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int n = cJSON_GetArraySize(wm);
    if (n == 0) {
        rc = cn_err_set(err, CN_EFORMAT, "%s: weight_map is empty", index_path);
        goto fail;
    }
    if (!(shards = malloc((size_t)n * sizeof *shards))) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e)) {
            rc = cn_err_set(err, CN_EFORMAT, "%s: weight_map: tensor '%s' does not map to a file "
                            "name", index_path, e->string);
            goto fail;
        }
        if (!shard_name_ok(e->valuestring)) {
            rc = cn_err_set(err, CN_EFORMAT, "%s: weight_map: tensor '%s' names shard '%s', which "
                            "is not a plain file name in the directory", index_path, e->string,
                            e->valuestring);
            goto fail;
        }
        /* Shard counts are small (tens), so a linear scan beats another hash table. */
        int k = 0;
        while (k < n_shards && strcmp(shards[k], e->valuestring) != 0) k++;
        if (k == n_shards) shards[n_shards++] = e->valuestring;
    }
    if (!(st = st_new(n_shards))) {
        rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    for (int i = 0; i < n_shards; i++) {
        if (!(st->paths[i] = path_join(dir, shards[i]))) {
            rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", index_path);
            goto fail;
        }
        if (!file_exists(st->paths[i])) {
            rc = cn_err_set(err, CN_ENOENT, "%s: names shard '%s', but %s does not exist",
                            index_path, shards[i], st->paths[i]);
            goto fail;
        }
    }
    if ((rc = open_all(st, n_shards, err))) goto fail;
    cJSON_ArrayForEach(e, wm) {
        const cn_st_tensor *t = cn_st_find(st, e->string);
        if (!t) {
            rc = cn_err_set(err, CN_EFORMAT, "%s: weight_map puts tensor '%s' in shard '%s', but "
                            "that shard has no such tensor", index_path, e->string,
                            e->valuestring);
            goto fail;
        }
        if (strcmp(shards[t->file], e->valuestring) != 0) {
            rc = cn_err_set(err, CN_EFORMAT, "%s: weight_map puts tensor '%s' in shard '%s', but "
                            "it is in '%s'", index_path, e->string, e->valuestring,
                            shards[t->file]);
            goto fail;
        }
    }
    *out = st;
    free(shards);
    cJSON_Delete(root);
    return CN_OK;
fail:
    cn_st_close(st);
    free(shards);
    cJSON_Delete(root);
    return rc;
}

int cn_st_open_dir(cn_safetensors **out, const char *dir, cn_err *err) {
    char *index = path_join(dir, "model.safetensors.index.json");
    char *single = path_join(dir, "model.safetensors");
    int rc;
    if (!index || !single) rc = cn_err_set(err, CN_ENOMEM, "%s: out of memory", dir);
    else if (file_exists(index)) rc = open_index(out, dir, index, err);
    else if (file_exists(single)) rc = cn_st_open_file(out, single, err);
    else
        rc = cn_err_set(err, CN_ENOENT,
                        "%s: neither model.safetensors.index.json nor model.safetensors exists",
                        dir);
    free(index);
    free(single);
    return rc;
}

void cn_st_close(cn_safetensors *st) {
    if (!st) return;
    if (st->maps)
        for (int i = 0; i < st->n_files; i++) cn_mapfile_close(&st->maps[i]);
    if (st->paths)
        for (int i = 0; i < st->n_files; i++) free(st->paths[i]);
    for (int i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->maps);
    free(st->paths);
    free(st->tensors);
    free(st->slots);
    free(st);
}

const cn_st_tensor *cn_st_find(const cn_safetensors *st, const char *name) {
    if (!st->n_slots) return NULL;
    uint32_t s = st->slots[slot_of(st, name)];
    return s ? &st->tensors[s - 1] : NULL;
}

int cn_st_count(const cn_safetensors *st) { return st->n_tensors; }

const cn_st_tensor *cn_st_at(const cn_safetensors *st, int i) {
    return i >= 0 && i < st->n_tensors ? &st->tensors[i] : NULL;
}

const char *cn_st_file_path(const cn_safetensors *st, int i) {
    return i >= 0 && i < st->n_files ? st->paths[i] : NULL;
}
