/* toolcall_constraint.c - the forced tool call's byte recogniser; see toolcall_constraint.h.
 *
 * The call is a chain of literal sets (the opening, the names, "<parameter=" or the closing, the
 * keys, a string enum's values, the value's terminator) with two kinds of free text between them:
 * raw text, watched for the terminator and for "</", and a JSON value run by json_constraint.
 */
#include "text/toolcall_constraint.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/toolcall.h"

#define MAX_SET 64
#define MAX_LEAD_WS 4

enum { K_RAW, K_ENUM, K_JSON };
enum { P_LEAD, P_OPEN, P_NAME, P_PE, P_KEY, P_RAW, P_ENUM, P_JSON, P_TERM, P_DONE };

static const char kOpen[] = "<tool_call>\n<function=";
static const char kParam[] = "<parameter=";
static const char kClose[] = "</function>\n</tool_call>";
static const char kTerm[] = "\n</parameter>\n";

typedef struct tcc_param {
    int kind;
    int node;               /* K_JSON: its schema node */
    int min_len, max_len;   /* K_RAW */
    int n_enum;             /* K_ENUM: texts are VALUE "\n</parameter>\n" */
    char **etxt;
    size_t *elen;
} tcc_param;

typedef struct tcc_fn {
    int n;            /* parameters */
    char **ktxt;      /* [n] "KEY>\n" */
    size_t *klen;
    tcc_param *p;     /* [n] */
    uint64_t required;
} tcc_fn;

struct cn_tcc_spec {
    cn_jc_schema *s;
    int n_fn;
    tcc_fn *fn;
    char **ntxt;      /* [n_fn] "NAME>\n" */
    size_t *nlen;
    const char *fixed[3]; /* the single literals: opening, terminator; and the pair below */
    size_t fixed_len[3];
    const char *pe[2];
    size_t pe_len[2];
};

void cn_tcc_spec_free(cn_tcc_spec *sp) {
    if (!sp) return;
    for (int i = 0; i < sp->n_fn; i++) {
        tcc_fn *f = &sp->fn[i];
        for (int k = 0; k < f->n; k++) {
            free(f->ktxt[k]);
            for (int e = 0; e < f->p[k].n_enum; e++) free(f->p[k].etxt[e]);
            free(f->p[k].etxt);
            free(f->p[k].elen);
        }
        free(f->ktxt);
        free(f->klen);
        free(f->p);
        free(sp->ntxt[i]);
    }
    free(sp->fn);
    free(sp->ntxt);
    free(sp->nlen);
    cn_jc_schema_free(sp->s);
    free(sp);
}

static char *cat(const char *a, const char *b, size_t *len) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    *len = la + lb;
    return s;
}

static int bad_name(const char *s) { return !*s || strpbrk(s, "<>\n") != NULL; }

static int compile_fn(cn_tcc_spec *sp, tcc_fn *f, const cJSON *fn, const char *name, cn_err *err) {
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *props = cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "properties") : NULL;
    const cJSON *req = cJSON_IsObject(params) ? cJSON_GetObjectItemCaseSensitive(params, "required") : NULL;
    int n = cJSON_IsObject(props) ? cJSON_GetArraySize(props) : 0;
    if (n > MAX_SET)
        return cn_err_set(err, CN_EUNSUPPORTED, "tool %s has %d parameters; at most %d are supported",
                          name, n, MAX_SET);
    f->ktxt = calloc((size_t)n + 1, sizeof *f->ktxt);
    f->klen = calloc((size_t)n + 1, sizeof *f->klen);
    f->p = calloc((size_t)n + 1, sizeof *f->p);
    if (!f->ktxt || !f->klen || !f->p) return CN_ENOMEM;
    const cJSON *p;
    int i = 0;
    if (n) cJSON_ArrayForEach(p, props) {
        if (bad_name(p->string))
            return cn_err_set(err, CN_EUNSUPPORTED, "tool %s: parameter name \"%s\" cannot be written as a tag",
                              name, p->string);
        if (!(f->ktxt[i] = cat(p->string, ">\n", &f->klen[i]))) return CN_ENOMEM;
        f->n = i + 1;
        tcc_param *q = &f->p[i];
        int node, nv;
        cn_err e2;
        cn_err_clear(&e2);
        int rc = cn_jc_schema_add(sp->s, p, &node, &e2);
        if (rc) return cn_err_set(err, rc, "tool %s, parameter %s: %s", name, p->string, e2.msg);
        if (cn_jc_node_string_enum(sp->s, node, &nv)) {
            /* the values come back as strings, raw: write them so */
            q->kind = K_ENUM;
            const cJSON *en = cJSON_GetObjectItemCaseSensitive(p, "enum");
            const cJSON *cst = cJSON_GetObjectItemCaseSensitive(p, "const");
            q->etxt = calloc((size_t)nv, sizeof *q->etxt);
            q->elen = calloc((size_t)nv, sizeof *q->elen);
            if (!q->etxt || !q->elen) return CN_ENOMEM;
            const cJSON *v = en ? en->child : cst;
            for (int k = 0; k < nv && v; k++, v = en ? v->next : NULL) {
                if (strstr(v->valuestring, "</"))
                    return cn_err_set(err, CN_EUNSUPPORTED, "tool %s, parameter %s: an enum value holds \"</\"",
                                      name, p->string);
                if (!(q->etxt[k] = cat(v->valuestring, kTerm, &q->elen[k]))) return CN_ENOMEM;
                q->n_enum = k + 1;
            }
        } else if (cn_jc_node_is_string(sp->s, node, &q->min_len, &q->max_len)) {
            q->kind = K_RAW;
        } else {
            q->kind = K_JSON;
            q->node = node;
        }
        i++;
    }
    if (req && !cJSON_IsNull(req)) {
        const cJSON *r;
        if (!cJSON_IsArray(req))
            return cn_err_set(err, CN_EINVAL, "tool %s: parameters.required must be an array", name);
        cJSON_ArrayForEach(r, req) {
            int k = -1, q = 0;
            if (cJSON_IsString(r) && n) cJSON_ArrayForEach(p, props) {
                if (!strcmp(p->string, r->valuestring)) k = q;
                q++;
            }
            if (k < 0)
                return cn_err_set(err, CN_EINVAL, "tool %s: required names %s, which is not a parameter", name,
                                  cJSON_IsString(r) ? r->valuestring : "a non-string");
            f->required |= (uint64_t)1 << k;
        }
    }
    return CN_OK;
}

int cn_tcc_spec_new(cn_tcc_spec **out, const cJSON *tools, const char *only, cn_err *err) {
    *out = NULL;
    if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) == 0)
        return cn_err_set(err, CN_EINVAL, "a forced tool call needs tools");
    int n = cJSON_GetArraySize(tools);
    if (n > MAX_SET) return cn_err_set(err, CN_EUNSUPPORTED, "at most %d tools can be forced", MAX_SET);
    cn_tcc_spec *sp = calloc(1, sizeof *sp);
    int rc = CN_ENOMEM;
    if (!sp || cn_jc_schema_new(&sp->s)) goto fail;
    if (!(sp->fn = calloc((size_t)n, sizeof *sp->fn)) || !(sp->ntxt = calloc((size_t)n, sizeof *sp->ntxt)) ||
        !(sp->nlen = calloc((size_t)n, sizeof *sp->nlen)))
        goto fail;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) fn = t;
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || bad_name(nm->valuestring)) {
            rc = cn_err_set(err, CN_EINVAL, "every tool needs a name without '<', '>' or newlines");
            goto fail;
        }
        if (only && strcmp(only, nm->valuestring)) continue;
        int i = sp->n_fn;
        if (!(sp->ntxt[i] = cat(nm->valuestring, ">\n", &sp->nlen[i]))) goto fail;
        sp->n_fn++;
        if ((rc = compile_fn(sp, &sp->fn[i], fn, nm->valuestring, err))) goto fail;
    }
    if (sp->n_fn == 0) {
        rc = cn_err_set(err, CN_EINVAL, "no tool named \"%s\" is offered", only ? only : "");
        goto fail;
    }
    sp->fixed[0] = kOpen, sp->fixed_len[0] = sizeof kOpen - 1;
    sp->fixed[1] = kTerm, sp->fixed_len[1] = sizeof kTerm - 1;
    sp->pe[0] = kParam, sp->pe_len[0] = sizeof kParam - 1;
    sp->pe[1] = kClose, sp->pe_len[1] = sizeof kClose - 1;
    *out = sp;
    return CN_OK;
fail:
    if (rc == CN_ENOMEM) cn_err_set(err, CN_ENOMEM, "out of memory");
    cn_tcc_spec_free(sp);
    return rc;
}

/* ---- recognising --------------------------------------------------------------------------- */

static uint64_t all_bits(int n) { return n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1); }

void cn_tcc_init(cn_tcc *r, const cn_tcc_spec *sp) {
    memset(&r->sc, 0, sizeof r->sc);
    r->sp = sp;
    r->sc.phase = P_LEAD;
    r->jc.depth = 0;
    r->jc.s = sp->s;
}

void cn_tcc_sim_begin(cn_tcc_sim *m, const cn_tcc *r) {
    m->base = r;
    m->sc = r->sc;
    m->jmode = 0;
    if (r->sc.phase == P_JSON) {
        m->jmode = 1;
        cn_jc_sim_begin(&m->js, &r->jc);
    }
}

void cn_tcc_sim_commit(const cn_tcc_sim *m, cn_tcc *dst) {
    dst->sp = m->base->sp;
    dst->sc = m->sc;
    if (m->jmode) cn_jc_sim_commit(&m->js, &dst->jc);
}

/* The literal set of the current phase. */
static void lits(const cn_tcc_sim *m, const char *const **txt, const size_t **len) {
    const cn_tcc_spec *sp = m->base->sp;
    const tcc_fn *f = m->sc.fn >= 0 && m->sc.fn < sp->n_fn ? &sp->fn[m->sc.fn] : NULL;
    switch (m->sc.phase) {
    case P_OPEN: *txt = &sp->fixed[0], *len = &sp->fixed_len[0]; break;
    case P_TERM: *txt = &sp->fixed[1], *len = &sp->fixed_len[1]; break;
    case P_NAME: *txt = (const char *const *)sp->ntxt, *len = sp->nlen; break;
    case P_PE: *txt = sp->pe, *len = sp->pe_len; break;
    case P_KEY: *txt = (const char *const *)f->ktxt, *len = f->klen; break;
    default: *txt = (const char *const *)f->p[m->sc.key].etxt, *len = f->p[m->sc.key].elen; break;
    }
}

static void to_pe(cn_tcc_sim *m) {
    const tcc_fn *f = &m->base->sp->fn[m->sc.fn];
    m->sc.phase = P_PE;
    m->sc.off = 0;
    m->sc.mask = 0;
    if (all_bits(f->n) & ~m->sc.seen) m->sc.mask |= 1;
    if (!(f->required & ~m->sc.seen)) m->sc.mask |= 2;
}

static void value_done(cn_tcc_sim *m) {
    m->sc.seen |= (uint64_t)1 << m->sc.key;
    to_pe(m);
}

/* A literal of the set completed: candidate i. */
static void lit_done(cn_tcc_sim *m, int i) {
    const cn_tcc_spec *sp = m->base->sp;
    switch (m->sc.phase) {
    case P_OPEN:
        m->sc.phase = P_NAME, m->sc.off = 0, m->sc.mask = all_bits(sp->n_fn);
        break;
    case P_NAME:
        m->sc.fn = i;
        m->sc.seen = 0;
        to_pe(m);
        break;
    case P_PE:
        if (i == 1) {
            m->sc.phase = P_DONE;
            break;
        }
        m->sc.phase = P_KEY, m->sc.off = 0;
        m->sc.mask = all_bits(sp->fn[m->sc.fn].n) & ~m->sc.seen;
        break;
    case P_KEY: {
        const tcc_param *q = &sp->fn[m->sc.fn].p[i];
        m->sc.key = i;
        m->sc.off = 0;
        if (q->kind == K_ENUM) {
            m->sc.phase = P_ENUM, m->sc.mask = all_bits(q->n_enum);
        } else if (q->kind == K_RAW) {
            m->sc.phase = P_RAW;
            m->sc.tp = m->sc.chars = m->sc.lt = m->sc.u8 = 0;
        } else {
            m->sc.phase = P_JSON;
            cn_jc_init(&m->fresh, sp->s, q->node);
            cn_jc_sim_begin(&m->js, &m->fresh);
            m->jmode = 2;
        }
        break;
    }
    default: /* P_ENUM, P_TERM */
        value_done(m);
        break;
    }
}

static int lit_byte(cn_tcc_sim *m, unsigned b) {
    const char *const *txt;
    const size_t *len;
    lits(m, &txt, &len);
    uint64_t keep = 0;
    for (int i = 0; i < 64; i++)
        if ((m->sc.mask >> i & 1) && len[i] > (size_t)m->sc.off && (unsigned char)txt[i][m->sc.off] == b)
            keep |= (uint64_t)1 << i;
    if (!keep) return 0;
    m->sc.mask = keep;
    m->sc.off++;
    for (int i = 0; i < 64; i++)
        if ((keep >> i & 1) && len[i] == (size_t)m->sc.off) {
            lit_done(m, i);
            break;
        }
    return 1;
}

/* One content byte of a raw value (not part of a possible terminator). */
static int raw_content(cn_tcc_sim *m, unsigned b) {
    cn_tcc_sc *s = &m->sc;
    const tcc_param *q = &m->base->sp->fn[s->fn].p[s->key];
    if (s->u8) {
        if ((int)b < s->lo || (int)b > s->hi) return 0;
        s->lo = 0x80, s->hi = 0xbf;
        s->u8--;
        return 1;
    }
    if (b == 0 || (s->lt && b == '/')) return 0;
    if (q->max_len >= 0 && s->chars >= q->max_len) return 0;
    s->chars++;
    s->lt = b == '<';
    if (b >= 0x80) {
        if (b < 0xc2 || b > 0xf4) return 0;
        s->u8 = b < 0xe0 ? 1 : b < 0xf0 ? 2 : 3;
        s->lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80;
        s->hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
    }
    return 1;
}

static int raw_byte(cn_tcc_sim *m, unsigned b) {
    cn_tcc_sc *s = &m->sc;
    if (s->tp > 0) {
        if ((unsigned char)kTerm[s->tp] == b) {
            if (++s->tp < (int)sizeof kTerm - 1) return 1;
            if (s->chars < m->base->sp->fn[s->fn].p[s->key].min_len) return 0;
            value_done(m);
            return 1;
        }
        if (s->tp >= 3) return 0; /* "\n</" was not the terminator: "</" cannot be content */
        for (int i = 0; i < s->tp; i++)
            if (!raw_content(m, (unsigned char)kTerm[i])) return 0;
        s->tp = 0;
    }
    if (b == '\n' && !s->u8) {
        s->tp = 1;
        return 1;
    }
    return raw_content(m, b);
}

int cn_tcc_sim_byte(cn_tcc_sim *m, unsigned char c) {
    unsigned b = c;
    switch (m->sc.phase) {
    case P_LEAD:
        if (b == ' ' || b == '\n' || b == '\t' || b == '\r') return ++m->sc.ws <= MAX_LEAD_WS;
        m->sc.phase = P_OPEN, m->sc.off = 0, m->sc.mask = 1;
        return lit_byte(m, b);
    case P_RAW: return raw_byte(m, b);
    case P_JSON:
        if (b == '\n' && cn_jc_sim_accepting(&m->js)) { /* the value is whole: its terminator */
            m->sc.phase = P_TERM, m->sc.off = 0, m->sc.mask = 1;
            return lit_byte(m, b);
        }
        return cn_jc_sim_byte(&m->js, c);
    case P_DONE: return 0;
    default: return lit_byte(m, b);
    }
}

int cn_tcc_sim_plain_room(const cn_tcc_sim *m) {
    return m->sc.phase == P_JSON ? cn_jc_sim_plain_room(&m->js) : -1;
}

int cn_tcc_sim_raw_room(const cn_tcc_sim *m) {
    const cn_tcc_sc *s = &m->sc;
    if (s->phase != P_RAW || s->tp || s->lt || s->u8) return -1;
    const tcc_param *q = &m->base->sp->fn[s->fn].p[s->key];
    return q->max_len < 0 ? INT_MAX : q->max_len - s->chars;
}

int cn_tcc_check(const cn_tcc *r, const char *b, size_t n) {
    cn_tcc_sim m;
    cn_tcc_sim_begin(&m, r);
    for (size_t i = 0; i < n; i++)
        if (!cn_tcc_sim_byte(&m, (unsigned char)b[i])) return 0;
    return 1;
}

int cn_tcc_feed(cn_tcc *r, const char *b, size_t n) {
    cn_tcc_sim m;
    cn_tcc_sim_begin(&m, r);
    for (size_t i = 0; i < n; i++)
        if (!cn_tcc_sim_byte(&m, (unsigned char)b[i])) return 0;
    cn_tcc_sim_commit(&m, r);
    return 1;
}

int cn_tcc_finished(const cn_tcc *r) { return r->sc.phase == P_DONE; }

int cn_tcc_specials_ok(const cn_tcc *r) {
    return r->sc.phase != P_RAW && r->sc.phase != P_JSON && r->sc.phase != P_ENUM;
}
