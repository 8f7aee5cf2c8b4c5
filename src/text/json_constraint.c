/* json_constraint.c - the JSON recogniser and its schema compiler; see json_constraint.h.
 *
 * The state is a stack of frames, one per value being read. A VALUE frame (a value expected,
 * nothing read yet) turns in place into what its first byte starts: OBJ, ARR, STR, NUM or LIT (a
 * fixed set of candidate texts: an enum, true/false/null, or an object's remaining keys). A frame
 * that completes pops itself and tells its parent (done_child); a number or an ambiguous literal
 * only knows it ended when a byte it cannot take arrives, so that byte is dispatched again to the
 * parent. Containers push their children only where the depth leaves room for them.
 */
#include "text/json_constraint.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- schemas ------------------------------------------------------------------------------- */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64, T_ANY = 127 };

#define MAX_SET 64          /* candidates of one literal set: enum values, keys */
#define MAX_SCHEMA_DEPTH 12 /* nested object/array schemas; leaves room in CN_JC_MAX_DEPTH */

typedef struct jc_node {
    int types;           /* T_* bits */
    int closed;          /* object: keys only from key[] */
    int n_props;
    char **key;          /* [n_props] the key as JSON text, quotes included */
    size_t *key_len;
    int *prop;           /* [n_props] node of each property */
    uint64_t required;   /* bit i: key[i] is required */
    int items;           /* array: node of the items */
    int min_items, max_items, min_len, max_len; /* -1: no bound (min: 0) */
    int n_enum;          /* 0: no enum */
    char **lit;          /* [n_enum] each value as compact JSON text */
    size_t *lit_len;
    int enum_strings;    /* every enum value is a string */
    int n_any;           /* anyOf / oneOf: branches, told apart by a value's first byte */
    int *any;            /* [n_any] branch nodes */
    unsigned *any_cls;   /* [n_any] C_* first-byte classes of each branch */
} jc_node;

/* Classes of a value's first byte, which is all an anyOf branch is chosen by. */
enum { C_OBJ = 1, C_ARR = 2, C_STR = 4, C_NUM = 8, C_TRUE = 16, C_FALSE = 32, C_NULL = 64 };

struct cn_jc_schema {
    jc_node *nodes;
    int n, cap;
    const cJSON *root; /* while compiling: the schema that $ref paths start from */
    int refs;          /* while compiling: $refs being followed */
};

static void node_free(jc_node *d) {
    for (int i = 0; i < d->n_props; i++) free(d->key[i]);
    for (int i = 0; i < d->n_enum; i++) free(d->lit[i]);
    free(d->key);
    free(d->key_len);
    free(d->prop);
    free(d->lit);
    free(d->lit_len);
    free(d->any);
    free(d->any_cls);
}

static int node_new(cn_jc_schema *s, int types) {
    if (s->n == s->cap) {
        int c = s->cap ? s->cap * 2 : 8;
        jc_node *nn = realloc(s->nodes, (size_t)c * sizeof *nn);
        if (!nn) return CN_ENOMEM;
        s->nodes = nn;
        s->cap = c;
    }
    jc_node *d = &s->nodes[s->n];
    memset(d, 0, sizeof *d);
    d->types = types;
    d->max_items = d->max_len = -1;
    d->items = 0;
    return s->n++;
}

int cn_jc_schema_new(cn_jc_schema **out) {
    cn_jc_schema *s = calloc(1, sizeof *s);
    if (!s || node_new(s, T_ANY) < 0) {
        free(s);
        return CN_ENOMEM;
    }
    *out = s;
    return CN_OK;
}

void cn_jc_schema_free(cn_jc_schema *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) node_free(&s->nodes[i]);
    free(s->nodes);
    free(s);
}

static int type_bit(const char *t) {
    static const struct { const char *name; int bit; } k[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM | T_INT},
        {"string", T_STR}, {"array", T_ARR}, {"object", T_OBJ}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(t, k[i].name)) return k[i].bit;
    return 0;
}

static int is_annotation(const char *k) {
    static const char *const a[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                    "examples", "deprecated", "readOnly", "writeOnly"};
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        if (!strcmp(k, a[i])) return 1;
    return 0;
}

/* A non-negative integer keyword into *v. */
static int count_kw(const cJSON *x, const char *path, int *v, cn_err *err) {
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e9 ||
        x->valuedouble != (double)(int)x->valuedouble)
        return cn_err_set(err, CN_EINVAL, "schema %s.%s must be a non-negative integer", path,
                          x->string);
    *v = (int)x->valuedouble;
    return CN_OK;
}

static int compile(cn_jc_schema *s, const cJSON *j, const char *path, int depth, int *out,
                   cn_err *err);

static unsigned byte_class(unsigned b) {
    return b == '{' ? C_OBJ : b == '[' ? C_ARR : b == '"' ? C_STR : (b == '-' || (b >= '0' && b <= '9')) ? C_NUM
         : b == 't' ? C_TRUE : b == 'f' ? C_FALSE : b == 'n' ? C_NULL : 0;
}

/* The first-byte classes a value of node may start with. */
static unsigned node_classes(const cn_jc_schema *s, int node) {
    const jc_node *d = &s->nodes[node];
    unsigned c = 0;
    if (d->n_any) {
        for (int i = 0; i < d->n_any; i++) c |= d->any_cls[i];
        return c;
    }
    if (d->n_enum) {
        for (int i = 0; i < d->n_enum; i++) c |= byte_class((unsigned char)d->lit[i][0]);
        return c;
    }
    if (d->types & T_OBJ) c |= C_OBJ;
    if (d->types & T_ARR) c |= C_ARR;
    if (d->types & T_STR) c |= C_STR;
    if (d->types & (T_INT | T_NUM)) c |= C_NUM;
    if (d->types & T_BOOL) c |= C_TRUE | C_FALSE;
    if (d->types & T_NULL) c |= C_NULL;
    return c;
}

/* anyOf / oneOf: each branch compiled; branches must start with different bytes (different JSON
 * types, or enums of different types), so that a value's first byte picks its branch. */
static int compile_any(cn_jc_schema *s, int idx, const cJSON *arr, const char *path, int depth,
                       cn_err *err) {
    const char *kw = arr->string;
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    if (n < 1) return cn_err_set(err, CN_EINVAL, "schema %s.%s must be a non-empty array", path, kw);
    int *any = calloc((size_t)n, sizeof *any);
    unsigned *cls = calloc((size_t)n, sizeof *cls);
    s->nodes[idx].any = any, s->nodes[idx].any_cls = cls; /* owned by the node from here */
    if (!any || !cls) return CN_ENOMEM;
    const cJSON *b;
    int i = 0, types = 0;
    char sub[256];
    cJSON_ArrayForEach(b, arr) {
        snprintf(sub, sizeof sub, "%s.%s[%d]", path, kw, i);
        int child, rc = compile(s, b, sub, depth + 1, &child, err);
        if (rc) return rc;
        unsigned c = node_classes(s, child);
        for (int k = 0; k < i; k++)
            if (s->nodes[idx].any_cls[k] & c)
                return cn_err_set(err, CN_EUNSUPPORTED,
                                  "schema %s.%s: branches %d and %d may start alike; cairn takes %s "
                                  "whose branches are of different JSON types", path, kw, k, i, kw);
        s->nodes[idx].any[i] = child;
        s->nodes[idx].any_cls[i] = c;
        s->nodes[idx].n_any = ++i;
        types |= s->nodes[child].types;
    }
    s->nodes[idx].types = types;
    return CN_OK;
}

/* Fills node idx's properties from "properties" and "required". */
static int compile_props(cn_jc_schema *s, int idx, const cJSON *props, const cJSON *req,
                         const char *path, int depth, cn_err *err) {
    char sub[256];
    if (!cJSON_IsObject(props))
        return cn_err_set(err, CN_EINVAL, "schema %s.properties must be an object", path);
    int n = cJSON_GetArraySize(props);
    if (n > MAX_SET)
        return cn_err_set(err, CN_EUNSUPPORTED, "schema %s has %d properties; at most %d are supported",
                          path, n, MAX_SET);
    char **key = calloc((size_t)n + 1, sizeof *key);
    size_t *key_len = calloc((size_t)n + 1, sizeof *key_len);
    int *prop = calloc((size_t)n + 1, sizeof *prop);
    jc_node *d = &s->nodes[idx];
    d->key = key, d->key_len = key_len, d->prop = prop; /* owned by the node from here */
    if (!key || !key_len || !prop) return CN_ENOMEM;
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        cJSON *ks = cJSON_CreateString(p->string);
        char *txt = ks ? cJSON_PrintUnformatted(ks) : NULL;
        cJSON_Delete(ks);
        if (!txt) return CN_ENOMEM;
        s->nodes[idx].key[i] = txt;
        s->nodes[idx].key_len[i] = strlen(txt);
        s->nodes[idx].n_props = i + 1;
        snprintf(sub, sizeof sub, "%s.properties.%s", path, p->string);
        int child;
        int rc = compile(s, p, sub, depth + 1, &child, err);
        if (rc) return rc;
        s->nodes[idx].prop[i++] = child; /* compile may move s->nodes */
    }
    if (req && !cJSON_IsNull(req)) {
        if (!cJSON_IsArray(req))
            return cn_err_set(err, CN_EINVAL, "schema %s.required must be an array of names", path);
        const cJSON *r;
        cJSON_ArrayForEach(r, req) {
            int k = -1;
            if (cJSON_IsString(r)) {
                p = props->child;
                for (int q = 0; p; p = p->next, q++)
                    if (!strcmp(p->string, r->valuestring)) k = q;
            }
            if (k < 0)
                return cn_err_set(err, CN_EINVAL, "schema %s.required names %s, which is not among its properties",
                                  path, cJSON_IsString(r) ? r->valuestring : "a non-string");
            s->nodes[idx].required |= (uint64_t)1 << k;
        }
    }
    return CN_OK;
}

/* The schema a local $ref ("#/$defs/NAME", "#/definitions/NAME") names, or NULL. */
static const cJSON *resolve(const cn_jc_schema *s, const char *ref) {
    const char *name = NULL;
    const cJSON *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) name = ref + 8, defs = cJSON_GetObjectItemCaseSensitive(s->root, "$defs");
    else if (!strncmp(ref, "#/definitions/", 14))
        name = ref + 14, defs = cJSON_GetObjectItemCaseSensitive(s->root, "definitions");
    if (!strcmp(ref, "#")) return s->root;
    return name && cJSON_IsObject(defs) && !strchr(name, '/') ? cJSON_GetObjectItemCaseSensitive(defs, name) : NULL;
}

static int compile(cn_jc_schema *s, const cJSON *j, const char *path, int depth, int *out,
                   cn_err *err) {
    if (cJSON_IsTrue(j)) {
        *out = 0;
        return CN_OK;
    }
    if (!cJSON_IsObject(j)) return cn_err_set(err, CN_EINVAL, "schema %s must be an object", path);
    if (depth > MAX_SCHEMA_DEPTH)
        return cn_err_set(err, CN_EUNSUPPORTED, "schema %s nests deeper than %d levels%s", path,
                          MAX_SCHEMA_DEPTH, s->refs ? " through $ref (does it refer to itself?)" : "");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(j, "$ref");
    if (ref) { /* a reference stands for its target; beside it only annotations */
        const cJSON *k, *target = cJSON_IsString(ref) ? resolve(s, ref->valuestring) : NULL;
        if (!target)
            return cn_err_set(err, CN_EUNSUPPORTED, "schema %s.$ref: only local references into $defs "
                              "or definitions are supported", path);
        cJSON_ArrayForEach(k, j)
            if (strcmp(k->string, "$ref") && strcmp(k->string, "$defs") && strcmp(k->string, "definitions") &&
                !is_annotation(k->string))
                return cn_err_set(err, CN_EUNSUPPORTED, "schema %s: \"%s\" beside $ref is not supported",
                                  path, k->string);
        char sub[256];
        snprintf(sub, sizeof sub, "%s", ref->valuestring);
        s->refs++;
        int rc = compile(s, target, sub, depth + 1, out, err);
        s->refs--;
        return rc;
    }
    int types = 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (cJSON_IsString(t)) {
        if (!(types = type_bit(t->valuestring)))
            return cn_err_set(err, CN_EUNSUPPORTED, "schema %s.type \"%s\" is not a JSON type", path,
                              t->valuestring);
    } else if (cJSON_IsArray(t)) {
        const cJSON *x;
        cJSON_ArrayForEach(x, t) {
            int b = cJSON_IsString(x) ? type_bit(x->valuestring) : 0;
            if (!b) return cn_err_set(err, CN_EINVAL, "schema %s.type lists something that is not a JSON type", path);
            types |= b;
        }
    } else if (t) {
        return cn_err_set(err, CN_EINVAL, "schema %s.type must be a string or an array", path);
    }
    /* A schema without a type that speaks of properties or items means that container. */
    if (!types) {
        if (cJSON_GetObjectItemCaseSensitive(j, "properties")) types = T_OBJ;
        else if (cJSON_GetObjectItemCaseSensitive(j, "items")) types = T_ARR;
        else types = T_ANY;
    }
    int idx = node_new(s, types);
    if (idx < 0) return idx;
    const cJSON *k;
    const cJSON *props = NULL, *req = NULL, *items = NULL, *en = NULL, *any = NULL;
    int rc;
    cJSON_ArrayForEach(k, j) {
        const char *n = k->string;
        jc_node *d = &s->nodes[idx];
        if (!strcmp(n, "type") || is_annotation(n) || !strcmp(n, "$defs") || !strcmp(n, "definitions"))
            continue; /* $defs are compiled where a $ref names them */
        if (!strcmp(n, "properties")) props = k;
        else if (!strcmp(n, "required")) req = k;
        else if (!strcmp(n, "items")) items = k;
        else if (!strcmp(n, "anyOf") || !strcmp(n, "oneOf")) {
            if (any) return cn_err_set(err, CN_EUNSUPPORTED, "schema %s has both anyOf and oneOf", path);
            any = k;
        }
        else if (!strcmp(n, "enum") || !strcmp(n, "const")) {
            if (en) return cn_err_set(err, CN_EUNSUPPORTED, "schema %s has both enum and const", path);
            en = k;
        } else if (!strcmp(n, "additionalProperties")) {
            if (!cJSON_IsFalse(k))
                return cn_err_set(err, CN_EUNSUPPORTED,
                                  "schema %s.additionalProperties: only false is supported", path);
        } else if (!strcmp(n, "minLength")) {
            if ((rc = count_kw(k, path, &d->min_len, err))) return rc;
        } else if (!strcmp(n, "maxLength")) {
            if ((rc = count_kw(k, path, &d->max_len, err))) return rc;
        } else if (!strcmp(n, "minItems")) {
            if ((rc = count_kw(k, path, &d->min_items, err))) return rc;
        } else if (!strcmp(n, "maxItems")) {
            if ((rc = count_kw(k, path, &d->max_items, err))) return rc;
        } else {
            return cn_err_set(err, CN_EUNSUPPORTED, "schema %s: keyword \"%s\" is not supported", path, n);
        }
    }
    if (any) {
        if (t || en || props || items || req)
            return cn_err_set(err, CN_EUNSUPPORTED, "schema %s: %s beside other constraints is not supported; "
                              "put them in its branches", path, any->string);
        if ((rc = compile_any(s, idx, any, path, depth, err))) return rc;
        *out = idx;
        return CN_OK;
    }
    jc_node *d = &s->nodes[idx];
    if ((d->max_len >= 0 && d->min_len > d->max_len) || (d->max_items >= 0 && d->min_items > d->max_items))
        return cn_err_set(err, CN_EINVAL, "schema %s: a minimum is above its maximum", path);
    if (en) {
        cJSON *one = NULL;
        const cJSON *vals = en;
        if (!strcmp(en->string, "const")) {
            if (!(one = cJSON_CreateArray())) return CN_ENOMEM;
            cJSON_AddItemToArray(one, cJSON_Duplicate(en, 1));
            vals = one;
        } else if (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0) {
            return cn_err_set(err, CN_EINVAL, "schema %s.enum must be a non-empty array", path);
        }
        int n = cJSON_GetArraySize(vals);
        if (n > MAX_SET) {
            cJSON_Delete(one);
            return cn_err_set(err, CN_EUNSUPPORTED, "schema %s.enum has %d values; at most %d are supported",
                              path, n, MAX_SET);
        }
        d->lit = calloc((size_t)n, sizeof *d->lit);
        d->lit_len = calloc((size_t)n, sizeof *d->lit_len);
        if (!d->lit || !d->lit_len) {
            cJSON_Delete(one);
            return CN_ENOMEM;
        }
        d->enum_strings = 1;
        const cJSON *v;
        cJSON_ArrayForEach(v, vals) {
            char *txt = cJSON_PrintUnformatted(v);
            if (!txt) {
                cJSON_Delete(one);
                return CN_ENOMEM;
            }
            d->lit[d->n_enum] = txt;
            d->lit_len[d->n_enum++] = strlen(txt);
            if (!cJSON_IsString(v)) d->enum_strings = 0;
        }
        cJSON_Delete(one);
        *out = idx; /* the values say everything; the rest would only narrow them */
        return CN_OK;
    }
    char sub[256];
    if (items) {
        snprintf(sub, sizeof sub, "%s.items", path);
        int child;
        if ((rc = compile(s, items, sub, depth + 1, &child, err))) return rc;
        s->nodes[idx].items = child;
    }
    if (props) {
        s->nodes[idx].closed = 1;
        if ((rc = compile_props(s, idx, props, req, path, depth, err))) return rc;
    } else if (req && cJSON_GetArraySize(req) > 0) {
        return cn_err_set(err, CN_EUNSUPPORTED, "schema %s.required needs properties that define the keys", path);
    }
    *out = idx;
    return CN_OK;
}

int cn_jc_schema_add(cn_jc_schema *s, const cJSON *schema, int *node, cn_err *err) {
    if (!schema) {
        int idx = node_new(s, T_OBJ);
        if (idx < 0) return idx;
        *node = idx;
        return CN_OK;
    }
    s->root = schema;
    s->refs = 0;
    int rc = compile(s, schema, "$", 0, node, err);
    s->root = NULL;
    return rc;
}

int cn_jc_node_is_string(const cn_jc_schema *s, int node, int *min_len, int *max_len) {
    const jc_node *d = &s->nodes[node];
    *min_len = d->min_len;
    *max_len = d->max_len;
    return d->n_enum == 0 && (d->types & T_STR);
}

int cn_jc_node_string_enum(const cn_jc_schema *s, int node, int *n_values) {
    const jc_node *d = &s->nodes[node];
    *n_values = d->n_enum;
    return d->n_enum > 0 && d->enum_strings;
}

/* ---- the recogniser ------------------------------------------------------------------------ */

enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { O_FIRST, O_KEY, O_COLON, O_VAL, O_AFTER, O_NEXT };
enum { A_FIRST, A_VAL, A_AFTER };
enum { S_CHR, S_ESC, S_HEX, S_U8 };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { L_ENUM, L_KEY, L_WORD };

static const char *const kWord[3] = {"true", "false", "null"};
static const size_t kWordLen[3] = {4, 5, 4};

void cn_jc_init(cn_jc *r, const cn_jc_schema *s, int node) {
    r->s = s;
    r->depth = 1;
    r->ws = 0;
    r->done = 0;
    memset(&r->st[0], 0, sizeof r->st[0]);
    r->st[0].kind = F_VALUE;
    r->st[0].node = node;
}

void cn_jc_sim_begin(cn_jc_sim *m, const cn_jc *r) {
    m->base = r;
    m->nbase = r->depth;
    m->nloc = 0;
    m->ws = r->ws;
    m->done = r->done;
}

void cn_jc_sim_commit(const cn_jc_sim *m, cn_jc *dst) {
    if (dst != m->base) {
        memcpy(dst->st, m->base->st, (size_t)m->nbase * sizeof *dst->st);
        dst->s = m->base->s;
    }
    memcpy(dst->st + m->nbase, m->loc, (size_t)m->nloc * sizeof *dst->st);
    dst->depth = m->nbase + m->nloc;
    dst->ws = m->ws;
    dst->done = m->done;
}

static int depth(const cn_jc_sim *m) { return m->nbase + m->nloc; }

/* The top frame, writable: a base frame is copied up first. NULL when the stack is empty. */
static cn_jc_frame *top(cn_jc_sim *m) {
    if (m->nloc == 0) {
        if (m->nbase == 0) return NULL;
        m->loc[0] = m->base->st[--m->nbase];
        m->nloc = 1;
    }
    return &m->loc[m->nloc - 1];
}

static const cn_jc_frame *peek(const cn_jc_sim *m) {
    if (m->nloc) return &m->loc[m->nloc - 1];
    return m->nbase ? &m->base->st[m->nbase - 1] : NULL;
}

static void push(cn_jc_sim *m, int kind, int node) {
    cn_jc_frame *f = &m->loc[m->nloc++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = node;
}

static const jc_node *nd(const cn_jc_sim *m, int node) { return &m->base->s->nodes[node]; }

/* The candidate texts of a literal frame. */
static void lit_set(const cn_jc_sim *m, const cn_jc_frame *f, const char *const **txt,
                    const size_t **len) {
    const jc_node *d = nd(m, f->node);
    if (f->st == L_WORD) *txt = kWord, *len = kWordLen;
    else if (f->st == L_KEY) *txt = (const char *const *)d->key, *len = d->key_len;
    else *txt = (const char *const *)d->lit, *len = d->lit_len;
}

/* Index of a candidate in mask whose text is exactly n bytes, or -1. */
static int lit_complete(const cn_jc_sim *m, const cn_jc_frame *f) {
    const char *const *txt;
    const size_t *len;
    lit_set(m, f, &txt, &len);
    for (int i = 0; i < 64; i++)
        if ((f->mask >> i & 1) && len[i] == (size_t)f->n) return i;
    return -1;
}

static int num_complete(const cn_jc_frame *f) {
    return f->st == N_ZERO || f->st == N_INT || f->st == N_FRAC || f->st == N_EXP;
}

/* Pops the completed top frame; idx is the literal matched (a key's property). */
static void done_child(cn_jc_sim *m, int idx) {
    if (m->nloc) m->nloc--;
    else m->nbase--;
    cn_jc_frame *p = top(m);
    if (!p) {
        m->done = 1;
        return;
    }
    if (p->kind == F_OBJ) {
        if (p->st == O_KEY) {
            p->st = O_COLON;
            p->n = idx;
        } else {
            p->st = O_AFTER;
            if (p->n >= 0) p->mask |= (uint64_t)1 << p->n;
        }
    } else if (p->kind == F_ARR) {
        p->st = A_AFTER;
    }
}

static int is_ws(unsigned b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static int is_digit(unsigned b) { return b >= '0' && b <= '9'; }
static int is_hex(unsigned b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

static int ws_ok(cn_jc_sim *m) { return ++m->ws <= CN_JC_MAX_WS; }

static int str_room(const jc_node *d, const cn_jc_frame *f) { return d->max_len < 0 || f->n < d->max_len; }

static int step_str(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    const jc_node *d = nd(m, f->node);
    switch (f->st) {
    case S_CHR:
        if (b == '"') {
            if (f->n < d->min_len) return 0;
            done_child(m, -1);
            return 1;
        }
        if (b < 0x20 || !str_room(d, f)) return 0;
        f->n++;
        if (b == '\\') f->st = S_ESC;
        else if (b >= 0x80) {
            if (b < 0xc2 || b > 0xf4) return 0;
            f->st = S_U8;
            f->aux = b < 0xe0 ? 1 : b < 0xf0 ? 2 : 3;
            f->lo = b == 0xe0 ? 0xa0 : b == 0xf0 ? 0x90 : 0x80;
            f->hi = b == 0xed ? 0x9f : b == 0xf4 ? 0x8f : 0xbf;
        }
        return 1;
    case S_ESC:
        if (b == 'u') {
            f->st = S_HEX;
            f->aux = 4;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", (int)b) || b == 0) return 0;
        f->st = S_CHR;
        return 1;
    case S_HEX:
        if (!is_hex(b)) return 0;
        if (--f->aux == 0) f->st = S_CHR;
        return 1;
    default: /* S_U8 */
        if (b < f->lo || b > f->hi) return 0;
        f->lo = 0x80, f->hi = 0xbf;
        if (--f->aux == 0) f->st = S_CHR;
        return 1;
    }
}

/* Returns 1 (taken), 0 (refused) or 2 (the number ended before b: dispatch b again). */
static int step_num(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    int frac_ok = (nd(m, f->node)->types & T_NUM) != 0;
    int dig = is_digit(b);
    switch (f->st) {
    case N_MINUS:
        if (!dig) return 0;
        f->st = b == '0' ? N_ZERO : N_INT;
        f->n = 1;
        return 1;
    case N_ZERO:
    case N_INT:
        if (dig) {
            if (f->st == N_ZERO || f->n >= CN_JC_MAX_DIGITS) return 0;
            f->n++;
            return 1;
        }
        if (frac_ok && b == '.') {
            f->st = N_DOT;
            return 1;
        }
        if (frac_ok && (b == 'e' || b == 'E')) {
            f->st = N_E;
            return 1;
        }
        break;
    case N_DOT:
        if (!dig) return 0;
        f->st = N_FRAC;
        f->n = 1;
        return 1;
    case N_FRAC:
        if (dig) return f->n < CN_JC_MAX_DIGITS ? (f->n++, 1) : 0;
        if (b == 'e' || b == 'E') {
            f->st = N_E;
            return 1;
        }
        break;
    case N_E:
        if (b == '+' || b == '-') {
            f->st = N_ESIGN;
            return 1;
        }
        /* fall through */
    case N_ESIGN:
        if (!dig) return 0;
        f->st = N_EXP;
        f->n = 1;
        return 1;
    default: /* N_EXP */
        if (dig) return f->n < 3 ? (f->n++, 1) : 0;
        break;
    }
    done_child(m, -1);
    return 2;
}

/* Returns 1, 0, or 2 (the literal ended before b). */
static int step_lit(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    const char *const *txt;
    const size_t *len;
    lit_set(m, f, &txt, &len);
    uint64_t keep = 0, longer = 0;
    for (int i = 0; i < 64; i++) {
        if (!(f->mask >> i & 1)) continue;
        if (len[i] > (size_t)f->n && (unsigned char)txt[i][f->n] == b) {
            keep |= (uint64_t)1 << i;
            if (len[i] > (size_t)f->n + 1) longer |= (uint64_t)1 << i;
        }
    }
    if (keep) {
        f->mask = keep;
        f->n++;
        if (!longer) { /* every candidate left is complete: exactly one, the texts being distinct */
            int i = 0;
            while (!(keep >> i & 1)) i++;
            done_child(m, i);
        }
        return 1;
    }
    int c = lit_complete(m, f);
    if (c < 0) return 0;
    done_child(m, c);
    return 2;
}

static uint64_t all_bits(int n) { return n >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1); }

/* Starts the value frame f on byte b. Returns 1, 0, or 2 (f became a literal: dispatch b again). */
static int step_value(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    const jc_node *d = nd(m, f->node);
    if (is_ws(b)) return ws_ok(m);
    if (d->n_any) { /* the first byte picks the branch, which then reads it */
        unsigned c = byte_class(b);
        for (int i = 0; i < d->n_any; i++)
            if (d->any_cls[i] & c) {
                f->node = d->any[i];
                return 2;
            }
        return 0;
    }
    int room = depth(m) < CN_JC_MAX_DEPTH - 1; /* a container must fit one child */
    if (d->n_enum) {
        f->kind = F_LIT, f->st = L_ENUM, f->n = 0, f->mask = all_bits(d->n_enum);
        return 2;
    }
    if (b == '{' && (d->types & T_OBJ) && room) {
        f->kind = F_OBJ, f->st = O_FIRST, f->n = -1, f->mask = 0;
        return 1;
    }
    if (b == '[' && (d->types & T_ARR) && room) {
        f->kind = F_ARR, f->st = A_FIRST, f->n = 0;
        return 1;
    }
    if (b == '"' && (d->types & T_STR)) {
        f->kind = F_STR, f->st = S_CHR, f->n = 0;
        return 1;
    }
    if ((b == '-' || is_digit(b)) && (d->types & (T_INT | T_NUM))) {
        f->kind = F_NUM, f->n = is_digit(b);
        f->st = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        return 1;
    }
    int w = b == 't' ? 0 : b == 'f' ? 1 : b == 'n' ? 2 : -1;
    if (w >= 0 && (d->types & (w == 2 ? T_NULL : T_BOOL))) {
        f->kind = F_LIT, f->st = L_WORD, f->n = 0, f->mask = w == 0 ? 1 : w == 1 ? 2 : 4;
        return 2;
    }
    return 0;
}

/* Starts a key in object frame f (at its opening quote). */
static int start_key(cn_jc_sim *m, cn_jc_frame *f) {
    const jc_node *d = nd(m, f->node);
    int node = f->node;
    f->st = O_KEY;
    if (!d->closed) {
        push(m, F_STR, 0);
        m->loc[m->nloc - 1].st = S_CHR;
        return 1;
    }
    uint64_t avail = all_bits(d->n_props) & ~f->mask;
    if (!avail) return 0;
    push(m, F_LIT, node);
    cn_jc_frame *k = &m->loc[m->nloc - 1];
    k->st = L_KEY;
    k->mask = avail;
    k->n = 1; /* the opening quote, which every key text starts with */
    return 1;
}

static int step_obj(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    const jc_node *d = nd(m, f->node);
    if (is_ws(b)) return f->st == O_KEY || f->st == O_VAL ? 0 : ws_ok(m);
    switch (f->st) {
    case O_FIRST:
    case O_NEXT:
        if (b == '"') return start_key(m, f);
        if (b == '}' && f->st == O_FIRST && !(d->required & ~f->mask)) {
            done_child(m, -1);
            return 1;
        }
        return 0;
    case O_COLON:
        if (b != ':') return 0;
        f->st = O_VAL;
        push(m, F_VALUE, d->closed ? d->prop[f->n] : 0);
        return 1;
    case O_AFTER:
        if (b == ',') {
            if (d->closed && !(all_bits(d->n_props) & ~f->mask)) return 0; /* no key left */
            f->st = O_NEXT;
            f->n = -1;
            return 1;
        }
        if (b == '}' && !(d->required & ~f->mask)) {
            done_child(m, -1);
            return 1;
        }
        return 0;
    default:
        return 0;
    }
}

static int step_arr(cn_jc_sim *m, cn_jc_frame *f, unsigned b) {
    const jc_node *d = nd(m, f->node);
    if (is_ws(b)) return f->st == A_VAL ? 0 : ws_ok(m);
    if (b == ']' && f->n >= d->min_items && f->st != A_VAL) {
        done_child(m, -1);
        return 1;
    }
    if (f->st == A_FIRST) {
        if (d->max_items == 0) return 0;
        f->n = 1;
        f->st = A_VAL;
        push(m, F_VALUE, d->items);
        return 2;
    }
    if (f->st == A_AFTER && b == ',') {
        if (d->max_items >= 0 && f->n >= d->max_items) return 0;
        f->n++;
        f->st = A_VAL;
        push(m, F_VALUE, d->items);
        return 1;
    }
    return 0;
}

int cn_jc_sim_byte(cn_jc_sim *m, unsigned char c) {
    unsigned b = c;
    for (int guard = 0; guard < CN_JC_MAX_DEPTH * 2 + 4; guard++) {
        cn_jc_frame *f = top(m);
        if (!f) return 0; /* the root value closed: nothing may follow */
        if (!is_ws(b) && f->kind != F_STR) m->ws = 0;
        int r;
        switch (f->kind) {
        case F_VALUE: r = step_value(m, f, b); break;
        case F_OBJ: r = step_obj(m, f, b); break;
        case F_ARR: r = step_arr(m, f, b); break;
        case F_STR: r = step_str(m, f, b); break;
        case F_NUM: r = step_num(m, f, b); break;
        default: r = step_lit(m, f, b); break;
        }
        if (r != 2) return r;
    }
    return 0;
}

int cn_jc_sim_accepting(const cn_jc_sim *m) {
    if (m->done) return 1;
    if (depth(m) != 1) return 0;
    const cn_jc_frame *f = peek(m);
    if (f->kind == F_NUM) return num_complete(f);
    if (f->kind == F_LIT) return lit_complete(m, f) >= 0;
    return 0;
}

int cn_jc_sim_plain_room(const cn_jc_sim *m) {
    const cn_jc_frame *f = peek(m);
    if (!f || f->kind != F_STR || f->st != S_CHR) return -1;
    const jc_node *d = nd(m, f->node);
    return d->max_len < 0 ? INT_MAX : d->max_len - f->n;
}

int cn_jc_check(const cn_jc *r, const char *b, size_t n) {
    cn_jc_sim m;
    cn_jc_sim_begin(&m, r);
    for (size_t i = 0; i < n; i++)
        if (!cn_jc_sim_byte(&m, (unsigned char)b[i])) return 0;
    return 1;
}

int cn_jc_feed(cn_jc *r, const char *b, size_t n) {
    cn_jc_sim m;
    cn_jc_sim_begin(&m, r);
    for (size_t i = 0; i < n; i++)
        if (!cn_jc_sim_byte(&m, (unsigned char)b[i])) return 0;
    cn_jc_sim_commit(&m, r);
    return 1;
}

int cn_jc_accepting(const cn_jc *r) {
    cn_jc_sim m;
    cn_jc_sim_begin(&m, r);
    return cn_jc_sim_accepting(&m);
}

int cn_jc_finished(const cn_jc *r) { return r->done; }
