/* cmd_cache.c - `cairn cache`: what the disk tier of the prefix cache holds.
 *
 * Lists, per model folder under --cache-dir (or only the folder of --model's identity), every node
 * file: its edge [start, end), user flag, one letter per layer (K attention rows, S recurrent
 * state, W sliding window, . nothing), payload bytes, and whether it verifies (checksum, format, model identity).
 * Read-only: nothing is moved, deleted or rewritten, even a file that fails; `cairn generate
 * --cache-dir` sets those aside when it loads the folder.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/disk.h"
#include "cli/cli.h"
#include "cli/flags.h"
#include "model/model.h"

typedef struct row {
    char name[40];   /* file name without the folder */
    int ok;
    int start, end, user;
    char *layers;    /* one letter per layer, or the reason it failed */
    uint64_t bytes;
} row;

typedef struct listing {
    row *r;
    int n, cap;
    int oom;
} listing;

static void on_file(void *ctx, const char *path, const cn_disk_node *h, int rc, const char *why) {
    (void)rc;
    listing *ls = ctx;
    if (ls->n == ls->cap) {
        int cap = ls->cap ? 2 * ls->cap : 32;
        row *p = realloc(ls->r, (size_t)cap * sizeof *p);
        if (!p) {
            ls->oom = 1;
            return;
        }
        ls->r = p;
        ls->cap = cap;
    }
    row *r = &ls->r[ls->n];
    memset(r, 0, sizeof *r);
    const char *base = strrchr(path, '/');
    snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : path);
    if (h) {
        r->ok = 1;
        r->start = h->start;
        r->end = h->end;
        r->user = h->user;
        r->bytes = h->payload_bytes;
        r->layers = malloc((size_t)h->n_layers + 1);
        if (r->layers) {
            for (int l = 0; l < h->n_layers; l++)
                r->layers[l] = ".KSW"[h->slots[l].kind >= 0 && h->slots[l].kind <= 3 ? h->slots[l].kind : 0];
            r->layers[h->n_layers] = '\0';
        }
    } else {
        r->layers = strdup(why && *why ? why : "unreadable");
    }
    if (!r->layers) {
        ls->oom = 1;
        return;
    }
    ls->n++;
}

static int by_offset(const void *x, const void *y) {
    const row *a = x, *b = y;
    if (a->ok != b->ok) return b->ok - a->ok;
    if (a->end != b->end) return a->end < b->end ? -1 : 1;
    if (a->start != b->start) return a->start < b->start ? -1 : 1;
    return strcmp(a->name, b->name);
}

typedef struct totals {
    int models, nodes, bad, aside;
    uint64_t bytes;
} totals;

/* Lists one model folder; returns 0 or 1 (folder unreadable, out of memory). */
static int list_model(const char *root, uint64_t id, totals *t) {
    char dir[4200];
    cn_disk_model_dir(root, id, dir, sizeof dir);
    listing ls = {0};
    int aside = 0;
    cn_err err;
    cn_err_clear(&err);
    if (cn_disk_scan(dir, id, on_file, &ls, &aside, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        return 1;
    }
    int status = ls.oom ? 1 : 0;
    if (ls.oom) fprintf(stderr, "cairn: out of memory listing %s\n", dir);
    if (ls.n) qsort(ls.r, (size_t)ls.n, sizeof *ls.r, by_offset);
    uint64_t bytes = 0;
    int nodes = 0;
    for (int i = 0; i < ls.n; i++)
        if (ls.r[i].ok) {
            bytes += ls.r[i].bytes;
            nodes++;
        }
    printf("model %016" PRIx64 ": %d nodes, %" PRIu64 " bytes (%s)\n", id, nodes, bytes, dir);
    if (ls.n) printf("  %-24s %7s %7s %4s  %-10s %12s  %s\n", "file", "start", "end", "user", "layers", "bytes", "status");
    for (int i = 0; i < ls.n; i++) {
        const row *r = &ls.r[i];
        if (r->ok)
            printf("  %-24s %7d %7d %4s  %-10s %12" PRIu64 "  ok\n", r->name, r->start, r->end,
                   r->user ? "yes" : "-", r->layers, r->bytes);
        else
            printf("  %-24s %7s %7s %4s  %-10s %12s  FAILS: %s\n", r->name, "-", "-", "-", "-", "-", r->layers);
    }
    if (aside) printf("  %d file%s set aside as .bad\n", aside, aside == 1 ? "" : "s");
    t->models++;
    t->nodes += nodes;
    t->bytes += bytes;
    t->bad += ls.n - nodes;
    t->aside += aside;
    for (int i = 0; i < ls.n; i++) free(ls.r[i].layers);
    free(ls.r);
    return status;
}

/* A model folder's name is its identity: 16 lowercase hex digits. */
static int parse_id(const char *name, uint64_t *id) {
    if (strlen(name) != 16) return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
    *id = strtoull(name, NULL, 16);
    return 1;
}

int cn_cmd_cache(int argc, char **argv) {
    const char *dir = NULL, *model = NULL;
    cn_flag flags[] = {
        {"cache-dir", CN_FLAG_STR, &dir, "DIR", "the disk tier's folder (as given to generate)", 1, 0},
        {"model", CN_FLAG_STR, &model, "DIR", "list only this model's restore points", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "cache --cache-dir DIR [--model DIR]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    totals t = {0};
    int status = 0;
    if (model) {
        uint64_t id;
        cn_err err;
        cn_err_clear(&err);
        if (cn_model_identity_dir(model, &id, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            return 1;
        }
        char mdir[4200];
        cn_disk_model_dir(dir, id, mdir, sizeof mdir);
        DIR *dp = opendir(mdir);
        if (!dp) printf("model %016" PRIx64 ": no restore points in %s\n", id, dir);
        else {
            closedir(dp);
            status = list_model(dir, id, &t);
        }
    } else {
        DIR *dp = opendir(dir);
        if (!dp) {
            fprintf(stderr, "cairn: cannot list %s: %s\n", dir, strerror(errno));
            return 1;
        }
        /* Sorted, so the output is stable. */
        uint64_t *ids = NULL;
        int n = 0, cap = 0;
        struct dirent *de;
        while ((de = readdir(dp))) {
            uint64_t id;
            if (!parse_id(de->d_name, &id)) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                uint64_t *p = realloc(ids, (size_t)cap * sizeof *p);
                if (!p) break;
                ids = p;
            }
            ids[n++] = id;
        }
        closedir(dp);
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
                uint64_t x = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = x;
            }
        for (int i = 0; i < n; i++) status |= list_model(dir, ids[i], &t);
        free(ids);
        if (!n) printf("no restore points in %s\n", dir);
    }
    printf("total: %d node%s in %d model%s, %" PRIu64 " bytes; %d failing verification, %d set aside\n",
           t.nodes, t.nodes == 1 ? "" : "s", t.models, t.models == 1 ? "" : "s", t.bytes, t.bad, t.aside);
    return status;
}
