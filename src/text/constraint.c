/* constraint.c - token masks over the byte recognisers; see constraint.h. */
#include "text/constraint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "text/json_constraint.h"
#include "text/toolcall_constraint.h"

enum { K_JSON, K_TOOL };

struct cn_constraint {
    const cn_token_bytes *tb; /* not owned */
    int kind;
    int gate;                 /* waiting for </think> */
    char win[8];              /* the last bytes seen while gated */
    int win_n;
    cn_jc_schema *schema;     /* K_JSON */
    cn_jc jc;
    cn_tcc_spec *spec;        /* K_TOOL */
    cn_tcc tcc;
};

static const char kThinkEnd[] = "</think>";

int cn_constraint_json(cn_constraint **out, const cn_token_bytes *tb, const cJSON *schema,
                       int after_think, cn_err *err) {
    *out = NULL;
    cn_constraint *c = calloc(1, sizeof *c);
    if (!c || cn_jc_schema_new(&c->schema)) {
        free(c);
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    int root, rc = cn_jc_schema_add(c->schema, schema, &root, err);
    if (rc) {
        cn_constraint_free(c);
        return rc;
    }
    c->tb = tb;
    c->kind = K_JSON;
    c->gate = after_think;
    cn_jc_init(&c->jc, c->schema, root);
    *out = c;
    return CN_OK;
}

int cn_constraint_tool(cn_constraint **out, const cn_token_bytes *tb, const cJSON *tools,
                       const char *only, int after_think, cn_err *err) {
    *out = NULL;
    cn_constraint *c = calloc(1, sizeof *c);
    if (!c) return cn_err_set(err, CN_ENOMEM, "out of memory");
    int rc = cn_tcc_spec_new(&c->spec, tools, only, err);
    if (rc) {
        free(c);
        return rc;
    }
    c->tb = tb;
    c->kind = K_TOOL;
    c->gate = after_think;
    cn_tcc_init(&c->tcc, c->spec);
    *out = c;
    return CN_OK;
}

void cn_constraint_free(cn_constraint *c) {
    if (!c) return;
    cn_jc_schema_free(c->schema);
    cn_tcc_spec_free(c->spec);
    free(c);
}

static int check(const cn_constraint *c, const char *b, size_t n) {
    return c->kind == K_JSON ? cn_jc_check(&c->jc, b, n) : cn_tcc_check(&c->tcc, b, n);
}

static int feed(cn_constraint *c, const char *b, size_t n) {
    return c->kind == K_JSON ? cn_jc_feed(&c->jc, b, n) : cn_tcc_feed(&c->tcc, b, n);
}

int cn_constraint_complete(const cn_constraint *c) {
    if (c->gate) return 0;
    return c->kind == K_JSON ? cn_jc_accepting(&c->jc) : cn_tcc_finished(&c->tcc);
}

static int finished(const cn_constraint *c) {
    return c->kind == K_JSON ? cn_jc_finished(&c->jc) : cn_tcc_finished(&c->tcc);
}

/* Characters of free text the state takes next, and the token class (CN_TB_*) that is such text
 * there; -1 when no class is taken whole. */
static int free_room(const cn_constraint *c, int *cls) {
    *cls = CN_TB_PLAIN;
    if (c->kind == K_JSON) {
        cn_jc_sim m;
        cn_jc_sim_begin(&m, &c->jc);
        return cn_jc_sim_plain_room(&m);
    }
    cn_tcc_sim m;
    cn_tcc_sim_begin(&m, &c->tcc);
    int r = cn_tcc_sim_raw_room(&m);
    if (r >= 0) {
        *cls = CN_TB_RAW;
        return r;
    }
    return cn_tcc_sim_plain_room(&m);
}

int cn_constraint_apply(cn_constraint *c, float *logits, int n_vocab) {
    if (c->gate) return 0; /* thinking: free, but it may not end before the value */
    if (finished(c)) {
        for (int i = 0; i < n_vocab; i++) logits[i] = -INFINITY;
        return CN_CONSTRAINT_EOS_OK | CN_CONSTRAINT_ONLY_EOS;
    }
    const cn_token_bytes *tb = c->tb;
    unsigned char first[256];
    for (int b = 0; b < 256; b++) {
        char ch = (char)b;
        first[b] = (unsigned char)check(c, &ch, 1);
    }
    int cls;
    int room = free_room(c, &cls);
    int specials = c->kind == K_TOOL && cn_tcc_specials_ok(&c->tcc);
    int any = 0;
    for (int id = 0; id < n_vocab; id++) {
        int ok = 0;
        if (id < tb->n && tb->len[id] > 0 && (specials || !(tb->flags[id] & CN_TB_SPECIAL))) {
            const char *s = tb->pool + tb->off[id];
            uint32_t n = tb->len[id];
            if (first[(unsigned char)s[0]]) {
                if (room >= 0 && (tb->flags[id] & cls) && tb->nchars[id] <= (uint32_t)room) ok = 1;
                else ok = n == 1 || check(c, s, n);
            }
        }
        if (ok) any++;
        else logits[id] = -INFINITY;
    }
    int fl = cn_constraint_complete(c) ? CN_CONSTRAINT_EOS_OK : 0;
    if (!any) fl |= CN_CONSTRAINT_EOS_OK | CN_CONSTRAINT_ONLY_EOS; /* no token spells a way on */
    return fl;
}

int cn_constraint_accept(cn_constraint *c, int32_t token) {
    const cn_token_bytes *tb = c->tb;
    if (token < 0 || token >= tb->n) return CN_EINVAL;
    const char *s = tb->pool + tb->off[token];
    size_t n = tb->len[token];
    if (c->gate) {
        const size_t tl = sizeof kThinkEnd - 1;
        for (size_t i = 0; i < n; i++) {
            if (c->win_n == (int)tl) {
                memmove(c->win, c->win + 1, tl - 1);
                c->win_n--;
            }
            c->win[c->win_n++] = s[i];
            if (c->win_n == (int)tl && !memcmp(c->win, kThinkEnd, tl)) {
                c->gate = 0;
                /* the rest of this token is the first of the value: taken if it fits */
                if (i + 1 < n) (void)feed(c, s + i + 1, n - i - 1);
                return CN_OK;
            }
        }
        return CN_OK;
    }
    if ((tb->flags[token] & CN_TB_SPECIAL) && !(c->kind == K_TOOL && cn_tcc_specials_ok(&c->tcc)))
        return CN_EINVAL;
    return feed(c, s, n) ? CN_OK : CN_EINVAL;
}
