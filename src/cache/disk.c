/* disk.c - node files, the writer thread and verified reads; see disk.h for the format.
 *
 * One mutex guards the queue; it is never held across I/O except to copy a queued image for a
 * read (a memcpy). The writer pops nothing until a job is done, so a read that finds its id in the
 * queue copies from an image that stays alive while the lock is held.
 */
#include "cache/disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/log.h"

#define MAGIC "CAIRNSNP"
#define FIXED 48          /* bytes of the fixed header */
#define SLOT_BYTES 24     /* bytes of one slot table entry */
#define MAX_LAYERS 65536  /* sanity bounds for headers read from disk */
#define MAX_END (1 << 28)

enum { JOB_WRITE = 1, JOB_REMOVE = 2 };

struct cn_disk_blob {
    struct cn_disk_blob *next;
    int op;
    uint64_t id;
    uint8_t *buf;      /* write: the whole image, trailer included */
    uint64_t size;
    int end, n_layers;
    uint64_t *off;     /* [n_layers] payload offset of each slot in buf; UINT64_MAX if absent */
};

struct cn_disk {
    char *dir;
    uint64_t model_id;
    uint64_t queue_limit;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    cn_disk_blob *head, *tail; /* FIFO; head is in flight while busy */
    int busy, stop, started;
    uint64_t queued;           /* bytes of images in the queue */
    int n_failed;
    pthread_t thread;
};

/* ---- little-endian fields ------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

uint64_t cn_disk_node_id(const cn_key *keys, int n) {
    XXH64_state_t st;
    XXH64_reset(&st, (uint64_t)n);
    uint8_t buf[8 * 64];
    for (int i = 0; i < n; i += 64) {
        int k = n - i < 64 ? n - i : 64;
        for (int j = 0; j < k; j++) put64(buf + 8 * j, keys[i + j]);
        XXH64_update(&st, buf, (size_t)k * 8);
    }
    uint64_t id = XXH64_digest(&st);
    return id ? id : 1;
}

void cn_disk_model_dir(const char *root, uint64_t model_id, char *buf, int size) {
    snprintf(buf, (size_t)size, "%s/%016" PRIx64, root, model_id);
}

void cn_disk_node_free(cn_disk_node *n) {
    free(n->keys);
    free(n->slots);
    n->keys = NULL;
    n->slots = NULL;
}

static uint64_t header_bytes(int end, int n_layers) {
    return FIXED + 8 * (uint64_t)end + SLOT_BYTES * (uint64_t)n_layers;
}

static char *node_path(const cn_disk *d, uint64_t id, const char *suffix) {
    size_t n = strlen(d->dir) + 40;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%016" PRIx64 "%s", d->dir, id, suffix);
    return p;
}

/* ---- reading and verifying -------------------------------------------------------------------- */

/* A byte source: a file (checksummed as it is read) or a queued image (trusted: it is ours). */
typedef struct src {
    FILE *f;
    const uint8_t *mem;
    uint64_t len, pos;       /* total bytes (file size or image size) and bytes consumed */
    XXH64_state_t h;
    const char *path;        /* for messages */
} src;

static int src_read(src *s, void *dst, uint64_t n, cn_err *err) {
    if (s->pos + n > s->len) return cn_err_set(err, CN_ETRUNC, "%s: truncated", s->path);
    if (s->mem) memcpy(dst, s->mem + s->pos, (size_t)n);
    else {
        if (fread(dst, 1, (size_t)n, s->f) != (size_t)n)
            return cn_err_set(err, feof(s->f) ? CN_ETRUNC : CN_EIO, "%s: %s", s->path,
                              feof(s->f) ? "truncated" : strerror(errno));
        XXH64_update(&s->h, dst, (size_t)n);
    }
    s->pos += n;
    return CN_OK;
}

/* Parses the header (fixed part, keys, slot table) into *out. */
static int parse_header(src *s, uint64_t model_id, cn_disk_node *out, cn_err *err) {
    uint8_t fx[FIXED];
    memset(out, 0, sizeof *out);
    int rc = src_read(s, fx, FIXED, err);
    if (rc) return rc;
    if (memcmp(fx, MAGIC, 8)) return cn_err_set(err, CN_EFORMAT, "%s: not a cairn cache file (bad magic)", s->path);
    uint32_t ver = get32(fx + 8);
    if (ver < 1 || ver > CN_DISK_VERSION)
        return cn_err_set(err, CN_EUNSUPPORTED, "%s: format version %u (this build reads %d)", s->path,
                          ver, CN_DISK_VERSION);
    out->model_id = get64(fx + 16);
    out->id = get64(fx + 24);
    uint32_t hb = get32(fx + 12), start = get32(fx + 32), end = get32(fx + 36), flags = get32(fx + 40);
    uint32_t nl = get32(fx + 44);
    if (out->model_id != model_id)
        return cn_err_set(err, CN_EFORMAT, "%s: written for model %016" PRIx64 ", not %016" PRIx64,
                          s->path, out->model_id, model_id);
    if (end < 1 || end > MAX_END || start >= end || nl > MAX_LAYERS || hb != header_bytes((int)end, (int)nl) ||
        (flags & ~3u) || ((flags & 2u) != 0) != (ver == 2))
        return cn_err_set(err, CN_EFORMAT, "%s: malformed header", s->path);
    if (hb + 8 > s->len) return cn_err_set(err, CN_ETRUNC, "%s: truncated", s->path);
    out->start = (int)start;
    out->end = (int)end;
    out->user = (int)(flags & 1);
    out->pairs = (int)((flags >> 1) & 1);
    out->n_layers = (int)nl;
    uint8_t *raw = malloc(hb - FIXED);
    out->keys = malloc((size_t)end * sizeof *out->keys);
    out->slots = calloc(nl ? nl : 1, sizeof *out->slots);
    if (!raw || !out->keys || !out->slots) {
        free(raw);
        cn_disk_node_free(out);
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    rc = src_read(s, raw, hb - FIXED, err);
    for (uint32_t i = 0; !rc && i < end; i++) out->keys[i] = get64(raw + 8 * (uint64_t)i);
    uint64_t total = 0;
    for (uint32_t l = 0; !rc && l < nl; l++) {
        const uint8_t *e = raw + 8 * (uint64_t)end + SLOT_BYTES * (uint64_t)l;
        cn_disk_slot *sl = &out->slots[l];
        sl->kind = (int)get32(e);
        sl->from = (int32_t)get32(e + 4);
        sl->to = (int32_t)get32(e + 8);
        sl->bytes = get64(e + 16);
        int ok = get32(e + 12) == 0 && sl->kind >= 0 && sl->kind <= 3 && sl->from >= 0 &&
                 sl->from <= sl->to && sl->bytes <= s->len && total + sl->bytes >= total;
        if (sl->kind == 0) ok = ok && sl->from == 0 && sl->to == 0 && sl->bytes == 0;
        if (!ok) rc = cn_err_set(err, CN_EFORMAT, "%s: malformed slot table (layer %u)", s->path, l);
        total += sl->bytes;
    }
    free(raw);
    if (!rc && cn_disk_node_id(out->keys, out->end) != out->id)
        rc = cn_err_set(err, CN_EFORMAT, "%s: node id does not match its key path", s->path);
    if (!rc && s->len != hb + total + 8)
        rc = cn_err_set(err, s->len < hb + total + 8 ? CN_ETRUNC : CN_EFORMAT, "%s: %s (%" PRIu64
                        " bytes, the header says %" PRIu64 ")", s->path,
                        s->len < hb + total + 8 ? "truncated" : "trailing bytes", s->len, hb + total + 8);
    if (rc) {
        cn_disk_node_free(out);
        return rc;
    }
    out->payload_bytes = total;
    out->file_bytes = hb + total + 8;
    return CN_OK;
}

/* Reads the payload: wanted layers into new buffers (bufs[l]), the rest streamed through the
 * checksum; then the trailer. On error every buffer made here is freed. */
static int read_payload(src *s, const cn_disk_node *n, const int *want, uint8_t **bufs, cn_err *err) {
    int rc = CN_OK;
    uint8_t scratch[1 << 14];
    for (int l = 0; bufs && l < n->n_layers; l++) bufs[l] = NULL;
    for (int l = 0; !rc && l < n->n_layers; l++) {
        uint64_t left = n->slots[l].bytes;
        if (want && want[l] && n->slots[l].kind) {
            bufs[l] = malloc(left ? left : 1);
            if (!bufs[l]) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
            else rc = src_read(s, bufs[l], left, err);
            continue;
        }
        while (!rc && left) {
            uint64_t k = left < sizeof scratch ? left : sizeof scratch;
            rc = src_read(s, scratch, k, err);
            left -= k;
        }
    }
    if (!rc && !s->mem) {
        uint64_t sum = XXH64_digest(&s->h);
        uint8_t tr[8];
        rc = src_read(s, tr, 8, err);
        if (!rc && get64(tr) != sum) rc = cn_err_set(err, CN_EFORMAT, "%s: checksum mismatch", s->path);
    }
    if (rc && bufs)
        for (int l = 0; l < n->n_layers; l++) {
            free(bufs[l]);
            bufs[l] = NULL;
        }
    return rc;
}

static int src_open(src *s, const char *path, int64_t *mtime, cn_err *err) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->f = fopen(path, "rb");
    struct stat sb;
    if (!s->f || fstat(fileno(s->f), &sb) != 0) {
        int e = errno;
        if (s->f) fclose(s->f);
        s->f = NULL;
        return cn_err_set(err, e == ENOENT ? CN_ENOENT : CN_EIO, "%s: %s", path, strerror(e));
    }
    s->len = (uint64_t)sb.st_size;
    if (mtime) *mtime = (int64_t)sb.st_mtime;
    XXH64_reset(&s->h, 0);
    return CN_OK;
}

/* Header and payload of one file, fully verified. */
static int load_file(const char *path, uint64_t model_id, cn_disk_node *hdr, const int *want,
                     uint8_t **bufs, cn_err *err) {
    src s;
    int64_t mtime = 0;
    int rc = src_open(&s, path, &mtime, err);
    if (rc) return rc;
    rc = parse_header(&s, model_id, hdr, err);
    if (!rc) {
        hdr->mtime = mtime;
        rc = read_payload(&s, hdr, want, bufs, err);
        if (rc) cn_disk_node_free(hdr);
    }
    fclose(s.f);
    return rc;
}

/* The file must describe exactly the node the caller holds. */
static int same_node(const cn_disk_node *a, const cn_disk_node *b, const char *path, cn_err *err) {
    int ok = a->start == b->start && a->end == b->end && a->n_layers == b->n_layers &&
             a->pairs == b->pairs &&
             !memcmp(a->keys, b->keys, (size_t)a->end * sizeof *a->keys);
    for (int l = 0; ok && l < a->n_layers; l++)
        ok = a->slots[l].kind == b->slots[l].kind && a->slots[l].from == b->slots[l].from &&
             a->slots[l].to == b->slots[l].to && a->slots[l].bytes == b->slots[l].bytes;
    return ok ? CN_OK : cn_err_set(err, CN_EFORMAT, "%s: describes another node than the cache holds", path);
}

int cn_disk_read(cn_disk *d, uint64_t id, const cn_disk_node *expect, const int *want,
                 uint8_t **out, cn_err *err) {
    int rc;
    char *path = node_path(d, id, CN_DISK_EXT);
    uint8_t **bufs = calloc((size_t)(expect->n_layers ? expect->n_layers : 1), sizeof *bufs);
    cn_disk_node hdr;
    memset(&hdr, 0, sizeof hdr);
    if (!path || !bufs) {
        rc = cn_err_set(err, CN_ENOMEM, "out of memory");
        goto done;
    }
    /* A queued image is the newest version of the node: serve it from memory. */
    pthread_mutex_lock(&d->mu);
    cn_disk_blob *last = NULL;
    for (cn_disk_blob *j = d->head; j; j = j->next)
        if (j->id == id) last = j;
    if (last) {
        if (last->op == JOB_REMOVE) rc = cn_err_set(err, CN_ENOENT, "%s: removed", path);
        else {
            src s = {.mem = last->buf, .len = last->size, .path = path};
            rc = parse_header(&s, d->model_id, &hdr, err);
            if (!rc) rc = read_payload(&s, &hdr, want, bufs, err);
        }
        pthread_mutex_unlock(&d->mu);
    } else {
        pthread_mutex_unlock(&d->mu);
        rc = load_file(path, d->model_id, &hdr, want, bufs, err);
    }
    if (!rc) {
        rc = same_node(&hdr, expect, path, err);
        for (int l = 0; l < expect->n_layers; l++) {
            if (rc) free(bufs[l]);
            else if (want[l]) out[l] = bufs[l];
            else free(bufs[l]);
        }
    }
done:
    cn_disk_node_free(&hdr);
    free(bufs);
    free(path);
    return rc;
}

int cn_disk_scan(const char *dir, uint64_t model_id, cn_disk_scan_fn fn, void *ctx, int *n_bad,
                 cn_err *err) {
    DIR *dp = opendir(dir);
    if (!dp) return cn_err_set(err, errno == ENOENT ? CN_ENOENT : CN_EIO, "%s: %s", dir, strerror(errno));
    if (n_bad) *n_bad = 0;
    size_t ext = strlen(CN_DISK_EXT);
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (len > 4 && !strcmp(de->d_name + len - 4, ".bad")) {
            if (n_bad) (*n_bad)++;
            continue;
        }
        if (len <= ext || strcmp(de->d_name + len - ext, CN_DISK_EXT)) continue;
        size_t n = strlen(dir) + len + 2;
        char *path = malloc(n);
        if (!path) continue;
        snprintf(path, n, "%s/%s", dir, de->d_name);
        cn_disk_node hdr;
        cn_err e;
        cn_err_clear(&e);
        int rc = load_file(path, model_id, &hdr, NULL, NULL, &e);
        if (!rc) {
            char want[40];
            snprintf(want, sizeof want, "%016" PRIx64 CN_DISK_EXT, hdr.id);
            if (strcmp(want, de->d_name))
                rc = cn_err_set(&e, CN_EFORMAT, "%s: file name does not match node id %016" PRIx64,
                                path, hdr.id);
        }
        fn(ctx, path, rc ? NULL : &hdr, rc, e.msg);
        if (!rc) cn_disk_node_free(&hdr);
        free(path);
    }
    closedir(dp);
    return CN_OK;
}

/* ---- the writer thread ------------------------------------------------------------------------ */

static int write_all(int fd, const uint8_t *p, uint64_t n) {
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (uint64_t)w;
    }
    return 0;
}

/* Writes one image under a temporary name, fsyncs, renames over the final name. */
static int do_write(cn_disk *d, cn_disk_blob *j) {
    put64(j->buf + j->size - 8, XXH64(j->buf, (size_t)(j->size - 8), 0));
    char suffix[48];
    snprintf(suffix, sizeof suffix, ".%ld.tmp", (long)getpid());
    char *tmp = node_path(d, j->id, suffix), *fin = node_path(d, j->id, CN_DISK_EXT);
    int rc = -1, fd = -1;
    if (!tmp || !fin) goto done;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write_all(fd, j->buf, j->size) || fsync(fd)) goto done;
    if (close(fd)) {
        fd = -1;
        goto done;
    }
    fd = -1;
    if (rename(tmp, fin)) goto done;
    rc = 0;
done:
    if (rc) {
        cn_warn("cache: cannot write %s: %s", fin ? fin : d->dir, strerror(errno));
        if (fd >= 0) close(fd);
        if (tmp) unlink(tmp);
    }
    free(tmp);
    free(fin);
    return rc;
}

static void do_remove(cn_disk *d, uint64_t id) {
    char *p = node_path(d, id, CN_DISK_EXT);
    if (p && unlink(p) && errno != ENOENT) cn_warn("cache: cannot remove %s: %s", p, strerror(errno));
    free(p);
}

static void job_free(cn_disk_blob *j) {
    if (!j) return;
    free(j->buf);
    free(j->off);
    free(j);
}

static void *writer(void *arg) {
    cn_disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->head && !d->stop) pthread_cond_wait(&d->work, &d->mu);
        if (!d->head) break;
        cn_disk_blob *j = d->head;
        d->busy = 1;
        pthread_mutex_unlock(&d->mu);
        int failed = j->op == JOB_WRITE ? do_write(d, j) != 0 : (do_remove(d, j->id), 0);
        pthread_mutex_lock(&d->mu);
        d->head = j->next;
        if (!d->head) d->tail = NULL;
        d->queued -= j->size;
        d->busy = 0;
        d->n_failed += failed;
        job_free(j);
        pthread_cond_broadcast(&d->idle);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

static void enqueue(cn_disk *d, cn_disk_blob *j) {
    j->next = NULL;
    if (d->tail) d->tail->next = j;
    else d->head = j;
    d->tail = j;
    d->queued += j->size;
    pthread_cond_signal(&d->work);
}

/* ---- open / close ----------------------------------------------------------------------------- */

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        int r = mkdir(path, 0755);
        *p = '/';
        if (r && errno != EEXIST) return -1;
    }
    return mkdir(path, 0755) && errno != EEXIST ? -1 : 0;
}

/* Removes "<id>.<pid>.tmp" files whose writer process is gone (it crashed mid-write). */
static void remove_orphans(const char *dir) {
    DIR *dp = opendir(dir);
    if (!dp) return;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t len = strlen(de->d_name);
        if (len < 22 || strcmp(de->d_name + len - 4, ".tmp") || de->d_name[16] != '.') continue;
        long pid = strtol(de->d_name + 17, NULL, 10);
        if (pid <= 0 || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        size_t n = strlen(dir) + len + 2;
        char *p = malloc(n);
        if (!p) continue;
        snprintf(p, n, "%s/%s", dir, de->d_name);
        unlink(p);
        free(p);
    }
    closedir(dp);
}

int cn_disk_open(cn_disk **out, const char *root, uint64_t model_id, uint64_t queue_limit,
                 cn_err *err) {
    cn_disk *d = calloc(1, sizeof *d);
    int rc = CN_OK;
    size_t n = strlen(root) + 24;
    if (!d || !(d->dir = malloc(n))) {
        free(d);
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    cn_disk_model_dir(root, model_id, d->dir, (int)n);
    d->model_id = model_id;
    d->queue_limit = queue_limit ? queue_limit : (uint64_t)256 << 20;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    struct stat sb;
    if (mkdir_p(d->dir) || stat(d->dir, &sb) || !S_ISDIR(sb.st_mode) || access(d->dir, W_OK | X_OK)) {
        rc = cn_err_set(err, CN_EIO, "cache directory %s: %s", d->dir,
                        errno ? strerror(errno) : "not a directory");
        goto fail;
    }
    remove_orphans(d->dir);
    cn_log_get_level(); /* read CAIRN_LOG here, not first in the writer thread */
    if (pthread_create(&d->thread, NULL, writer, d)) {
        rc = cn_err_set(err, CN_ENOMEM, "cannot start the cache writer thread");
        goto fail;
    }
    d->started = 1;
    *out = d;
    return CN_OK;
fail:
    cn_disk_close(d);
    return rc;
}

int cn_disk_flush(cn_disk *d) {
    pthread_mutex_lock(&d->mu);
    while (d->head) pthread_cond_wait(&d->idle, &d->mu);
    int failed = d->n_failed;
    pthread_mutex_unlock(&d->mu);
    return failed;
}

void cn_disk_close(cn_disk *d) {
    if (!d) return;
    if (d->started) {
        cn_disk_flush(d);
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->work);
    pthread_cond_destroy(&d->idle);
    free(d->dir);
    free(d);
}

const char *cn_disk_dir(const cn_disk *d) { return d->dir; }

/* ---- building and queueing images ------------------------------------------------------------- */

cn_disk_blob *cn_disk_blob_new(const cn_disk *d, const cn_disk_node *hdr) {
    if (hdr->end < 1 || hdr->start < 0 || hdr->start >= hdr->end || hdr->n_layers < 0) return NULL;
    cn_disk_blob *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    uint64_t hb = header_bytes(hdr->end, hdr->n_layers), total = 0;
    for (int l = 0; l < hdr->n_layers; l++) total += hdr->slots[l].kind ? hdr->slots[l].bytes : 0;
    b->op = JOB_WRITE;
    b->size = hb + total + 8;
    b->end = hdr->end;
    b->n_layers = hdr->n_layers;
    b->buf = malloc(b->size);
    b->off = malloc((size_t)(hdr->n_layers ? hdr->n_layers : 1) * sizeof *b->off);
    if (!b->buf || !b->off) {
        job_free(b);
        return NULL;
    }
    uint8_t *p = b->buf;
    memcpy(p, MAGIC, 8);
    put32(p + 8, hdr->pairs ? 2u : 1u);
    put32(p + 12, (uint32_t)hb);
    put64(p + 16, d->model_id);
    put64(p + 24, 0); /* the id, once the keys are in (submit) */
    put32(p + 32, (uint32_t)hdr->start);
    put32(p + 36, (uint32_t)hdr->end);
    put32(p + 40, (hdr->user ? 1u : 0u) | (hdr->pairs ? 2u : 0u));
    put32(p + 44, (uint32_t)hdr->n_layers);
    uint64_t off = hb;
    for (int l = 0; l < hdr->n_layers; l++) {
        const cn_disk_slot *s = &hdr->slots[l];
        uint8_t *e = p + FIXED + 8 * (uint64_t)hdr->end + SLOT_BYTES * (uint64_t)l;
        int k = s->kind;
        put32(e, (uint32_t)k);
        put32(e + 4, (uint32_t)(k ? s->from : 0));
        put32(e + 8, (uint32_t)(k ? s->to : 0));
        put32(e + 12, 0);
        put64(e + 16, k ? s->bytes : 0);
        b->off[l] = k ? off : UINT64_MAX;
        off += k ? s->bytes : 0;
    }
    return b;
}

void cn_disk_blob_set_key(cn_disk_blob *b, int i, cn_key key) { put64(b->buf + FIXED + 8 * (uint64_t)i, key); }

uint8_t *cn_disk_blob_slot(cn_disk_blob *b, int layer) {
    return b->off[layer] == UINT64_MAX ? NULL : b->buf + b->off[layer];
}

void cn_disk_blob_free(cn_disk_blob *b) { job_free(b); }

int cn_disk_submit(cn_disk *d, cn_disk_blob *b, uint64_t *id) {
    cn_key *keys = malloc((size_t)b->end * sizeof *keys);
    if (!keys) {
        job_free(b);
        return CN_ENOMEM;
    }
    for (int i = 0; i < b->end; i++) keys[i] = get64(b->buf + FIXED + 8 * (uint64_t)i);
    b->id = cn_disk_node_id(keys, b->end);
    free(keys);
    put64(b->buf + 24, b->id);
    uint64_t node_id = b->id; /* once queued, b belongs to the writer, which may free it at once */
    pthread_mutex_lock(&d->mu);
    int full = d->head && d->queued + b->size > d->queue_limit;
    if (!full) enqueue(d, b);
    pthread_mutex_unlock(&d->mu);
    if (full) {
        job_free(b);
        return CN_EBUSY;
    }
    *id = node_id;
    return CN_OK;
}

int cn_disk_remove(cn_disk *d, uint64_t id) {
    cn_disk_blob *j = calloc(1, sizeof *j);
    if (!j) return CN_ENOMEM;
    j->op = JOB_REMOVE;
    j->id = id;
    pthread_mutex_lock(&d->mu);
    /* Writes of this id not yet started would only be deleted again. */
    cn_disk_blob **pp = d->busy ? &d->head->next : &d->head, *prev = d->busy ? d->head : NULL;
    while (*pp) {
        cn_disk_blob *x = *pp;
        if (x->id == id && x->op == JOB_WRITE) {
            *pp = x->next;
            if (d->tail == x) d->tail = prev;
            d->queued -= x->size;
            job_free(x);
        } else {
            prev = x;
            pp = &x->next;
        }
    }
    enqueue(d, j);
    pthread_mutex_unlock(&d->mu);
    return CN_OK;
}

void cn_disk_set_aside(const char *path) {
    size_t n = strlen(path) + 8;
    char *to = malloc(n);
    if (!to) return;
    snprintf(to, n, "%s.bad", path);
    if (rename(path, to) && errno != ENOENT) cn_warn("cache: cannot move %s aside: %s", path, strerror(errno));
    free(to);
}

void cn_disk_quarantine(cn_disk *d, uint64_t id) {
    char *p = node_path(d, id, CN_DISK_EXT);
    if (p) cn_disk_set_aside(p);
    free(p);
}
