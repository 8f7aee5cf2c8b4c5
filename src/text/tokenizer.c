/* tokenizer.c - loading a tokenizer.json, and the encode pipeline around the BPE model.
 *
 * Written by hand because the file is a description of Hugging Face's pipeline, not a format a
 * library reads: this is where its JSON is turned into our tables, and where the order of steps
 * is kept exactly as `TokenizerImpl::encode_single_sequence` and `AddedVocabulary::
 * extract_and_normalize` run them (src/tokenizer/mod.rs, added_vocabulary.rs):
 *   1. added tokens with normalized=false are cut out of the raw text (leftmost longest match,
 *      then single_word / lstrip / rstrip; special ones only with CN_TOK_PARSE_SPECIAL);
 *   2. each remaining segment is normalized, then added tokens with normalized=true are cut out;
 *   3. each remaining piece is pre-tokenized and BPE-encoded (tok_pretokenize.c, tok_bpe.c);
 *   4. with CN_TOK_ADD_SPECIAL, the post-processor's template adds its ids around the result.
 * JSON is parsed with cJSON; the file is read once and dropped after loading.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/mapfile.h"
#include "text/tok_impl.h"

/* ---- JSON helpers --------------------------------------------------------------------------- */

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *k, int dflt) {
    const cJSON *v = jget(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A Hugging Face Pattern: {"String": "..."} or {"Regex": "..."}. */
static int parse_pattern(const cJSON *o, tok_pattern *p, const char *where, cn_err *err) {
    const char *s = jstr(o, "String");
    if (s) return tok_pattern_regex(p, s, strlen(s), 1, err);
    if ((s = jstr(o, "Regex"))) return tok_pattern_regex(p, s, strlen(s), 0, err);
    return cn_err_set(err, CN_EFORMAT, "%s: pattern is neither {\"String\"} nor {\"Regex\"}", where);
}

/* One code point given as a one-character string (Metaspace replacement, Strip content). */
static int parse_char(const char *s, uint32_t *cp, const char *where, cn_err *err) {
    size_t n = s ? strlen(s) : 0, k = 0;
    if (n == 0 || tok_utf8_check(s, n) != n || (*cp = tok_utf8_get(s, n, &k), k != n))
        return cn_err_set(err, CN_EFORMAT, "%s: expected exactly one character", where);
    return CN_OK;
}

static int parse_prepend(const cJSON *o, tok_prepend *pp, const char *where, cn_err *err) {
    const char *ps = jstr(o, "prepend_scheme");
    *pp = TOK_PREPEND_ALWAYS;
    if (ps) {
        if (!strcmp(ps, "first")) *pp = TOK_PREPEND_FIRST;
        else if (!strcmp(ps, "never")) *pp = TOK_PREPEND_NEVER;
        else if (strcmp(ps, "always"))
            return cn_err_set(err, CN_EFORMAT, "%s: unknown prepend_scheme '%s'", where, ps);
    }
    /* legacy files say add_prefix_space instead */
    const cJSON *aps = jget(o, "add_prefix_space");
    if (cJSON_IsBool(aps) && !cJSON_IsTrue(aps)) *pp = TOK_PREPEND_NEVER;
    return CN_OK;
}

/* ---- normalizers ---------------------------------------------------------------------------- */

static int add_norm(cn_tokenizer *t, tok_norm **slot, cn_err *err) {
    tok_norm *p = realloc(t->norm, (size_t)(t->n_norm + 1) * sizeof *p);
    if (!p) return cn_err_set(err, CN_ENOMEM, "out of memory");
    t->norm = p;
    *slot = &p[t->n_norm++];
    memset(*slot, 0, sizeof **slot);
    return CN_OK;
}

static int parse_normalizer(cn_tokenizer *t, const cJSON *o, cn_err *err) {
    if (cJSON_IsNull(o) || !o) return CN_OK;
    const char *type = jstr(o, "type");
    if (!type) return cn_err_set(err, CN_EFORMAT, "normalizer has no type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = jget(o, "normalizers"), *c;
        if (!cJSON_IsArray(a)) return cn_err_set(err, CN_EFORMAT, "normalizer Sequence: no normalizers list");
        cJSON_ArrayForEach(c, a) {
            int rc = parse_normalizer(t, c, err);
            if (rc) return rc;
        }
        return CN_OK;
    }
    tok_norm_kind k;
    if (!strcmp(type, "NFC")) k = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) k = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) k = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) k = TOK_NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) k = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Replace")) k = TOK_NORM_REPLACE;
    else if (!strcmp(type, "Prepend")) k = TOK_NORM_PREPEND;
    else if (!strcmp(type, "Strip")) k = TOK_NORM_STRIP;
    else return cn_err_set(err, CN_EUNSUPPORTED, "normalizer type '%s' is not supported", type);
    tok_norm *nm = NULL;
    int rc = add_norm(t, &nm, err);
    if (rc) return rc;
    nm->kind = k;
    if (k == TOK_NORM_REPLACE || k == TOK_NORM_PREPEND) {
        const char *s = jstr(o, k == TOK_NORM_REPLACE ? "content" : "prepend");
        if (!s) return cn_err_set(err, CN_EFORMAT, "normalizer %s: missing string", type);
        if (!(nm->str = dupn(s, strlen(s)))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        nm->str_len = strlen(s);
    }
    if (k == TOK_NORM_REPLACE) return parse_pattern(jget(o, "pattern"), &nm->pat, "normalizer Replace", err);
    if (k == TOK_NORM_STRIP) {
        nm->left = jbool(o, "strip_left", 1);
        nm->right = jbool(o, "strip_right", 1);
    }
    return CN_OK;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------- */

static const char kGpt2Regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_behavior(const char *s, tok_behavior *b) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (s && !strcmp(s, names[i])) {
            *b = (tok_behavior)i;
            return 1;
        }
    return 0;
}

static int parse_pretok(cn_tokenizer *t, const cJSON *o, cn_err *err) {
    if (cJSON_IsNull(o) || !o) return CN_OK;
    const char *type = jstr(o, "type");
    if (!type) return cn_err_set(err, CN_EFORMAT, "pre_tokenizer has no type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = jget(o, "pretokenizers"), *c;
        if (!cJSON_IsArray(a)) return cn_err_set(err, CN_EFORMAT, "pre_tokenizer Sequence: no pretokenizers list");
        cJSON_ArrayForEach(c, a) {
            int rc = parse_pretok(t, c, err);
            if (rc) return rc;
        }
        return CN_OK;
    }
    tok_pretok *p = realloc(t->pretok, (size_t)(t->n_pretok + 1) * sizeof *p);
    if (!p) return cn_err_set(err, CN_ENOMEM, "out of memory");
    t->pretok = p;
    p = &p[t->n_pretok];
    memset(p, 0, sizeof *p);
    int rc = CN_OK;
    if (!strcmp(type, "ByteLevel")) {
        p->kind = TOK_PT_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", 1);
        p->use_regex = jbool(o, "use_regex", 1);
        if (p->use_regex) rc = tok_pattern_regex(&p->pat, kGpt2Regex, sizeof kGpt2Regex - 1, 0, err);
    } else if (!strcmp(type, "Split")) {
        p->kind = TOK_PT_SPLIT;
        const char *b = jstr(o, "behavior");
        if (!parse_behavior(b, &p->behavior))
            return cn_err_set(err, CN_EFORMAT, "pre_tokenizer Split: unknown behavior '%s'", b ? b : "(none)");
        p->invert = jbool(o, "invert", 0);
        rc = parse_pattern(jget(o, "pattern"), &p->pat, "pre_tokenizer Split", err);
    } else if (!strcmp(type, "Digits")) {
        p->kind = TOK_PT_DIGITS;
        p->individual = jbool(o, "individual_digits", 0);
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = TOK_PT_METASPACE;
        const char *r = jstr(o, "replacement");
        if ((rc = parse_char(r, &p->repl_cp, "pre_tokenizer Metaspace replacement", err))) return rc;
        p->repl_len = strlen(r);
        memcpy(p->repl, r, p->repl_len);
        if ((rc = parse_prepend(o, &p->prepend, "pre_tokenizer Metaspace", err))) return rc;
        p->split = jbool(o, "split", 1);
    } else if (!strcmp(type, "Whitespace")) {
        p->kind = TOK_PT_WHITESPACE;
        static const char ws[] = "\\w+|[^\\w\\s]+";
        rc = tok_pattern_regex(&p->pat, ws, sizeof ws - 1, 0, err);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->kind = TOK_PT_WHITESPACE_SPLIT;
    } else {
        return cn_err_set(err, CN_EUNSUPPORTED, "pre_tokenizer type '%s' is not supported", type);
    }
    t->n_pretok++; /* counted even on a regex error so that free() releases what was built */
    return rc;
}

/* ---- decoders ------------------------------------------------------------------------------- */

static int parse_decoder(cn_tokenizer *t, const cJSON *o, int *joined, cn_err *err) {
    const char *type = jstr(o, "type");
    if (!type) return cn_err_set(err, CN_EFORMAT, "decoder has no type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = jget(o, "decoders"), *c;
        if (!cJSON_IsArray(a)) return cn_err_set(err, CN_EFORMAT, "decoder Sequence: no decoders list");
        cJSON_ArrayForEach(c, a) {
            int rc = parse_decoder(t, c, joined, err);
            if (rc) return rc;
        }
        return CN_OK;
    }
    tok_dec *d = realloc(t->dec, (size_t)(t->n_dec + 1) * sizeof *d);
    if (!d) return cn_err_set(err, CN_ENOMEM, "out of memory");
    t->dec = d;
    d = &d[t->n_dec];
    memset(d, 0, sizeof *d);
    int rc = CN_OK;
    if (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback")) {
        d->kind = type[4] == 'L' ? TOK_DEC_BYTELEVEL : TOK_DEC_BYTEFALLBACK;
        /* Both look at whole tokens; after the list was joined into one string they would see
         * the whole text as one token, which no real tokenizer asks for. */
        if (*joined) return cn_err_set(err, CN_EUNSUPPORTED, "decoder %s after Fuse/ByteLevel is not supported", type);
        if (d->kind == TOK_DEC_BYTELEVEL) *joined = 1;
    } else if (!strcmp(type, "Fuse")) {
        d->kind = TOK_DEC_FUSE;
        *joined = 1;
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = TOK_DEC_METASPACE;
        if ((rc = parse_char(jstr(o, "replacement"), &d->cp, "decoder Metaspace replacement", err))) return rc;
        if ((rc = parse_prepend(o, &d->prepend, "decoder Metaspace", err))) return rc;
    } else if (!strcmp(type, "Strip")) {
        d->kind = TOK_DEC_STRIP;
        if ((rc = parse_char(jstr(o, "content"), &d->cp, "decoder Strip content", err))) return rc;
        const cJSON *a = jget(o, "start"), *b = jget(o, "stop");
        d->start = cJSON_IsNumber(a) ? a->valueint : 0;
        d->stop = cJSON_IsNumber(b) ? b->valueint : 0;
    } else if (!strcmp(type, "Replace")) {
        d->kind = TOK_DEC_REPLACE;
        const cJSON *pat = jget(o, "pattern");
        const char *ps = jstr(pat, "String"), *c = jstr(o, "content");
        if (!ps) return cn_err_set(err, CN_EUNSUPPORTED, "decoder Replace: only {\"String\"} patterns are supported");
        if (!c) return cn_err_set(err, CN_EFORMAT, "decoder Replace: missing content");
        if (!*ps) return cn_err_set(err, CN_EFORMAT, "decoder Replace: empty pattern");
        if (!(d->pat = dupn(ps, strlen(ps))) || !(d->str = dupn(c, strlen(c)))) {
            free(d->pat);
            return cn_err_set(err, CN_ENOMEM, "out of memory");
        }
        d->pat_len = strlen(ps);
        d->str_len = strlen(c);
    } else {
        return cn_err_set(err, CN_EUNSUPPORTED, "decoder type '%s' is not supported", type);
    }
    t->n_dec++;
    return CN_OK;
}

/* ---- post-processors ------------------------------------------------------------------------ */

static int ids_append(int32_t **v, int *n, const int32_t *x, int k) {
    int32_t *p = realloc(*v, (size_t)(*n + k + 1) * sizeof *p);
    if (!p) return CN_ENOMEM;
    if (k) memcpy(p + *n, x, (size_t)k * sizeof *x);
    *v = p;
    *n += k;
    return CN_OK;
}

/* Wraps the current prefix/suffix: new = pre + old_prefix, old_suffix + suf. */
static int wrap_post(cn_tokenizer *t, const int32_t *pre, int npre, const int32_t *suf, int nsuf) {
    int32_t *np = NULL;
    int nn = 0;
    if (ids_append(&np, &nn, pre, npre) || ids_append(&np, &nn, t->post_prefix, t->n_post_prefix)) {
        free(np);
        return CN_ENOMEM;
    }
    free(t->post_prefix);
    t->post_prefix = np;
    t->n_post_prefix = nn;
    return ids_append(&t->post_suffix, &t->n_post_suffix, suf, nsuf);
}

static int parse_post(cn_tokenizer *t, const cJSON *o, cn_err *err) {
    if (cJSON_IsNull(o) || !o) return CN_OK;
    const char *type = jstr(o, "type");
    if (!type) return cn_err_set(err, CN_EFORMAT, "post_processor has no type");
    if (!strcmp(type, "ByteLevel")) return CN_OK; /* offsets only */
    if (!strcmp(type, "Sequence")) {
        const cJSON *a = jget(o, "processors"), *c;
        if (!cJSON_IsArray(a)) return cn_err_set(err, CN_EFORMAT, "post_processor Sequence: no processors list");
        cJSON_ArrayForEach(c, a) {
            int rc = parse_post(t, c, err);
            if (rc) return rc;
        }
        return CN_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = jget(o, "cls"), *sep = jget(o, "sep");
        const cJSON *ci = cJSON_GetArrayItem(cls, 1), *si = cJSON_GetArrayItem(sep, 1);
        if (!cJSON_IsNumber(ci) || !cJSON_IsNumber(si))
            return cn_err_set(err, CN_EFORMAT, "post_processor %s: cls/sep are not [token, id]", type);
        int32_t c = ci->valueint, s = si->valueint;
        return wrap_post(t, &c, 1, &s, 1) ? cn_err_set(err, CN_ENOMEM, "out of memory") : CN_OK;
    }
    if (strcmp(type, "TemplateProcessing"))
        return cn_err_set(err, CN_EUNSUPPORTED, "post_processor type '%s' is not supported", type);
    const cJSON *single = jget(o, "single"), *specials = jget(o, "special_tokens"), *piece;
    if (!cJSON_IsArray(single)) return cn_err_set(err, CN_EFORMAT, "post_processor TemplateProcessing: no single template");
    int32_t *pre = NULL, *suf = NULL;
    int npre = 0, nsuf = 0, seen_seq = 0, rc = CN_OK;
    cJSON_ArrayForEach(piece, single) {
        const cJSON *st = jget(piece, "SpecialToken");
        if (!st) {
            if (jget(piece, "Sequence")) seen_seq = 1;
            else rc = cn_err_set(err, CN_EFORMAT, "post_processor TemplateProcessing: unknown piece");
            if (rc) break;
            continue;
        }
        const char *name = jstr(st, "id");
        const cJSON *ids = name ? jget(jget(specials, name), "ids") : NULL, *x;
        if (!cJSON_IsArray(ids)) {
            rc = cn_err_set(err, CN_EFORMAT, "post_processor TemplateProcessing: special token '%s' has no ids",
                            name ? name : "(none)");
            break;
        }
        cJSON_ArrayForEach(x, ids) {
            int32_t id = cJSON_IsNumber(x) ? x->valueint : -1;
            if (ids_append(seen_seq ? &suf : &pre, seen_seq ? &nsuf : &npre, &id, 1)) {
                rc = cn_err_set(err, CN_ENOMEM, "out of memory");
                break;
            }
        }
        if (rc) break;
    }
    if (rc == CN_OK && wrap_post(t, pre, npre, suf, nsuf)) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    free(pre);
    free(suf);
    return rc;
}

/* ---- the BPE model -------------------------------------------------------------------------- */

static size_t pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

static int parse_model(cn_tokenizer *t, const cJSON *m, int32_t max_added_id, cn_err *err) {
    if (!cJSON_IsObject(m)) return cn_err_set(err, CN_EFORMAT, "tokenizer.json has no model object");
    const char *type = jstr(m, "type");
    const cJSON *vocab = jget(m, "vocab"), *merges = jget(m, "merges");
    if (!type) type = merges ? "BPE" : cJSON_IsArray(vocab) ? "Unigram" : jget(m, "max_input_chars_per_word") ? "WordPiece" : "WordLevel";
    if (strcmp(type, "BPE"))
        return cn_err_set(err, CN_EUNSUPPORTED, "tokenizer model type '%s' is not supported (only BPE is)", type);
    const cJSON *dropout = jget(m, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0)
        return cn_err_set(err, CN_EUNSUPPORTED, "BPE dropout %g is not supported (only null or 0)", dropout->valuedouble);
    if (!cJSON_IsObject(vocab)) return cn_err_set(err, CN_EFORMAT, "model.vocab is not an object");
    if (!cJSON_IsArray(merges)) return cn_err_set(err, CN_EFORMAT, "model.merges is not a list");

    /* ids and sizes */
    size_t nv = 0, pool = 0;
    int32_t max_id = max_added_id;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 2147483646.0)
            return cn_err_set(err, CN_EFORMAT, "model.vocab: '%s' has no valid id", e->string);
        if (e->valueint > max_id) max_id = e->valueint;
        pool += strlen(e->string) + 1;
        nv++;
    }
    t->n_ids = max_id + 1;
    t->str = calloc((size_t)t->n_ids, sizeof *t->str);
    t->len = calloc((size_t)t->n_ids, sizeof *t->len);
    t->pool = malloc(pool ? pool : 1);
    t->vmask = pow2_at_least(nv * 2) - 1;
    t->vslot = calloc(t->vmask + 1, sizeof *t->vslot);
    if (!t->str || !t->len || !t->pool || !t->vslot) return cn_err_set(err, CN_ENOMEM, "out of memory");
    char *w = t->pool;
    cJSON_ArrayForEach(e, vocab) {
        size_t l = strlen(e->string);
        int32_t id = e->valueint;
        memcpy(w, e->string, l + 1);
        t->str[id] = w;
        t->len[id] = (uint32_t)l;
        w += l + 1;
        size_t i = (size_t)tok_hash(t->str[id], l) & t->vmask;
        while (t->vslot[i]) i = (i + 1) & t->vmask;
        t->vslot[i] = (uint32_t)id + 1;
    }

    tok_bpe *b = &t->bpe;
    const char *s;
    if ((s = jstr(m, "continuing_subword_prefix"))) {
        if (!(b->prefix = dupn(s, strlen(s)))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        b->prefix_len = strlen(s);
    }
    if ((s = jstr(m, "end_of_word_suffix"))) {
        if (!(b->suffix = dupn(s, strlen(s)))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        b->suffix_len = strlen(s);
    }
    if ((s = jstr(m, "unk_token")) && !(b->unk_token = dupn(s, strlen(s))))
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    b->unk_id = b->unk_token ? tok_vocab_get(t, b->unk_token, strlen(b->unk_token)) : -1;
    b->fuse_unk = jbool(m, "fuse_unk", 0);
    b->byte_fallback = jbool(m, "byte_fallback", 0);
    b->ignore_merges = jbool(m, "ignore_merges", 0);
    for (int x = 0; x < 256; x++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", x);
        b->byte_tok[x] = tok_vocab_get(t, name, 6);
    }

    size_t nm = (size_t)cJSON_GetArraySize(merges);
    b->mmask = pow2_at_least(nm * 2) - 1;
    b->mkey = calloc(b->mmask + 1, sizeof *b->mkey);
    b->mrank = malloc((b->mmask + 1) * sizeof *b->mrank);
    b->mnew = malloc((b->mmask + 1) * sizeof *b->mnew);
    if (!b->mkey || !b->mrank || !b->mnew) return cn_err_set(err, CN_ENOMEM, "out of memory");
    uint32_t rank = 0;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *c;
        size_t la, lc;
        if (cJSON_IsString(e)) {
            /* "a b": HF's legacy form splits on ' ' and wants exactly two parts */
            a = e->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return cn_err_set(err, CN_EFORMAT, "merge %u ('%s') is not two tokens separated by one space", rank, a);
            la = (size_t)(sp - a);
            c = sp + 1;
            lc = strlen(c);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            a = e->child->valuestring;
            c = e->child->next->valuestring;
            la = strlen(a);
            lc = strlen(c);
        } else {
            return cn_err_set(err, CN_EFORMAT, "merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
        }
        int rc = tok_bpe_add_merge(t, a, la, c, lc, rank, err);
        if (rc) return rc;
        rank++;
    }
    return CN_OK;
}

/* ---- added tokens --------------------------------------------------------------------------- */

static int trie_add(tok_trie *tr, const char *s, size_t n, int32_t token) {
    if (n == 0) return CN_OK;
    int32_t *slot = &tr->root[(unsigned char)s[0]];
    for (size_t i = 0;; i++) {
        int32_t cur = *slot;
        /* find the child with byte s[i] among the siblings starting at *slot */
        while (cur >= 0 && tr->node[cur].byte != (uint8_t)s[i]) cur = tr->node[cur].sibling;
        if (cur < 0) {
            if (tr->n == tr->cap) {
                size_t cap = tr->cap ? tr->cap * 2 : 256;
                /* slot may point into node[]: keep its index across the realloc */
                ptrdiff_t off = slot >= tr->root && slot < tr->root + 256 ? -1 : (ptrdiff_t)(((char *)slot - (char *)tr->node));
                tok_trie_node *p = realloc(tr->node, cap * sizeof *p);
                if (!p) return CN_ENOMEM;
                tr->node = p;
                tr->cap = cap;
                if (off >= 0) slot = (int32_t *)((char *)tr->node + off);
            }
            cur = (int32_t)tr->n++;
            tr->node[cur] = (tok_trie_node){-1, *slot, -1, (uint8_t)s[i]};
            *slot = cur;
        }
        if (i + 1 == n) {
            /* the same spelling twice: the later token wins, as in HF's map */
            tr->node[cur].token = token;
            return CN_OK;
        }
        slot = &tr->node[cur].child;
    }
}

static int parse_added(cn_tokenizer *t, const cJSON *a, cn_err *err) {
    if (!a || cJSON_IsNull(a)) return CN_OK;
    if (!cJSON_IsArray(a)) return cn_err_set(err, CN_EFORMAT, "added_tokens is not a list");
    int n = cJSON_GetArraySize(a);
    if (!(t->added = calloc((size_t)(n ? n : 1), sizeof *t->added))) return cn_err_set(err, CN_ENOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        const char *c = jstr(e, "content");
        const cJSON *id = jget(e, "id");
        if (!c || !cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 2147483646.0)
            return cn_err_set(err, CN_EFORMAT, "added_tokens[%d]: needs a content string and an id", t->n_added);
        if (!*c) continue; /* HF ignores empty added tokens */
        tok_added *x = &t->added[t->n_added++];
        x->id = id->valueint;
        x->len = strlen(c);
        if (!(x->content = dupn(c, x->len))) return cn_err_set(err, CN_ENOMEM, "out of memory");
        x->single_word = (unsigned)jbool(e, "single_word", 0);
        x->lstrip = (unsigned)jbool(e, "lstrip", 0);
        x->rstrip = (unsigned)jbool(e, "rstrip", 0);
        x->special = (unsigned)jbool(e, "special", 0);
        x->normalized = (unsigned)jbool(e, "normalized", !x->special);
    }
    return CN_OK;
}

static int32_t max_added_id(const tok_added *a, int n) {
    int32_t m = -1;
    for (int i = 0; i < n; i++)
        if (a[i].id > m) m = a[i].id;
    return m;
}

/* After the model: ids, spellings, normalized forms and the two tries. */
static int finish_added(cn_tokenizer *t, cn_err *err) {
    if (!(t->is_added = calloc((size_t)t->n_ids, 1)) || !(t->added_of = malloc((size_t)t->n_ids * sizeof *t->added_of)))
        return cn_err_set(err, CN_ENOMEM, "out of memory");
    for (int32_t i = 0; i < t->n_ids; i++) t->added_of[i] = -1;
    for (int i = 0; i < 256; i++) t->trie_raw.root[i] = t->trie_norm.root[i] = -1;
    tok_scratch *sc = NULL;
    tok_buf nb = {0};
    int rc = CN_OK;
    for (int i = 0; i < t->n_added && rc == CN_OK; i++) {
        tok_added *x = &t->added[i];
        /* HF gives an added token the model's id for the same spelling when there is one */
        int32_t mid = tok_vocab_get(t, x->content, x->len);
        if (mid >= 0) x->id = mid;
        if (x->normalized && t->n_norm) {
            if (!sc && !(sc = tok_scratch_new(t))) {
                rc = cn_err_set(err, CN_ENOMEM, "out of memory");
                break;
            }
            if ((rc = tok_normalize(t->norm, t->n_norm, x->content, x->len, &nb, tok_scratch_rx(sc), err))) break;
            if (nb.n != x->len || memcmp(nb.p, x->content, x->len)) {
                if (!(x->norm = dupn(nb.p, nb.n))) {
                    rc = cn_err_set(err, CN_ENOMEM, "out of memory");
                    break;
                }
                x->norm_len = nb.n;
            }
        }
        /* decode spells an added token as HF's simple_id_to_token does: its normalized form */
        t->str[x->id] = x->norm ? x->norm : x->content;
        t->len[x->id] = (uint32_t)(x->norm ? x->norm_len : x->len);
        t->is_added[x->id] = 1;
        t->added_of[x->id] = i;
        if (x->normalized) rc = trie_add(&t->trie_norm, x->norm ? x->norm : x->content, x->norm ? x->norm_len : x->len, i);
        else rc = trie_add(&t->trie_raw, x->content, x->len, i);
        if (rc) rc = cn_err_set(err, CN_ENOMEM, "out of memory");
    }
    tok_buf_free(&nb);
    tok_scratch_free(sc);
    return rc;
}

/* ---- load / free ---------------------------------------------------------------------------- */

void cn_tok_free(cn_tokenizer *t) {
    if (!t) return;
    free(t->str);
    free(t->len);
    free(t->pool);
    free(t->vslot);
    free(t->is_added);
    free(t->added_of);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].norm);
    }
    free(t->added);
    free(t->trie_raw.node);
    free(t->trie_norm.node);
    free(t->bpe.mkey);
    free(t->bpe.mrank);
    free(t->bpe.mnew);
    free(t->bpe.prefix);
    free(t->bpe.suffix);
    free((char *)t->bpe.unk_token);
    for (int i = 0; i < t->n_norm; i++) {
        tok_pattern_free(&t->norm[i].pat);
        free(t->norm[i].str);
    }
    free(t->norm);
    for (int i = 0; i < t->n_pretok; i++) tok_pattern_free(&t->pretok[i].pat);
    free(t->pretok);
    for (int i = 0; i < t->n_dec; i++) {
        free(t->dec[i].pat);
        free(t->dec[i].str);
    }
    free(t->dec);
    free(t->post_prefix);
    free(t->post_suffix);
    free(t);
}

int cn_tok_load_json(cn_tokenizer **out, const char *json, size_t len, cn_err *err) {
    *out = NULL;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= json && at <= json + len ? (long)(at - json) : -1;
        return cn_err_set(err, CN_EFORMAT, "tokenizer.json is not valid JSON (error near byte %ld)", off);
    }
    cn_tokenizer *t = calloc(1, sizeof *t);
    int rc = CN_ENOMEM;
    if (!t) {
        cn_err_set(err, rc, "out of memory");
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        rc = cn_err_set(err, CN_EFORMAT, "tokenizer.json is not a JSON object");
        goto done;
    }
    /* the normalizer first: added tokens with normalized=true are matched in normalized form */
    if ((rc = parse_added(t, jget(root, "added_tokens"), err)) ||
        (rc = parse_model(t, jget(root, "model"), max_added_id(t->added, t->n_added), err)) ||
        (rc = parse_normalizer(t, jget(root, "normalizer"), err)) ||
        (rc = parse_pretok(t, jget(root, "pre_tokenizer"), err)) ||
        (rc = parse_post(t, jget(root, "post_processor"), err)))
        goto done;
    const cJSON *dec = jget(root, "decoder");
    if (dec && !cJSON_IsNull(dec)) {
        int joined = 0;
        t->has_decoder = 1;
        if ((rc = parse_decoder(t, dec, &joined, err))) goto done;
    }
    if ((rc = finish_added(t, err))) goto done;
    uint32_t cp[256];
    tok_byte_alphabet(cp);
    for (int i = 0; i < 0x144; i++) t->bl_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        tok_buf u = {0};
        if (tok_buf_put_cp(&u, cp[b])) {
            rc = cn_err_set(err, CN_ENOMEM, "out of memory");
            goto done;
        }
        memcpy(t->bl_str[b], u.p, u.n);
        t->bl_len[b] = (uint8_t)u.n;
        tok_buf_free(&u);
        t->bl_byte[cp[b]] = (int16_t)b;
    }
    int bl_dec = 0;
    for (int i = 0; i < t->n_dec; i++) bl_dec |= t->dec[i].kind == TOK_DEC_BYTELEVEL;
    /* ByteLevel with add_prefix_space adds a space the decoder keeps */
    int prefix_space = 0;
    for (int i = 0; i < t->n_pretok; i++)
        prefix_space |= t->pretok[i].kind == TOK_PT_BYTELEVEL && t->pretok[i].add_prefix_space;
    t->lossless = bl_dec && t->n_norm == 0 && !prefix_space;
    rc = CN_OK;
done:
    if (rc && t) {
        cn_tok_free(t);
        t = NULL;
    }
    cJSON_Delete(root);
    *out = t;
    return rc;
}

int cn_tok_load(cn_tokenizer **out, const char *path, cn_err *err) {
    *out = NULL;
    cn_mapfile m;
    int rc = cn_mapfile_open(&m, path, err);
    if (rc) return rc;
    rc = cn_tok_load_json(out, m.data ? (const char *)m.data : "", (size_t)m.size, err);
    if (rc && err) {
        char msg[CN_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        cn_err_set(err, rc, "%s: %s", path, msg);
    }
    cn_mapfile_close(&m);
    return rc;
}

/* ---- encode --------------------------------------------------------------------------------- */

typedef struct seg {
    size_t start, end;
    int32_t tok; /* added-token index, or -1 for text */
} seg;

typedef struct segs {
    seg *p;
    size_t n, cap;
} segs;

static int seg_push(segs *v, size_t a, size_t b, int32_t tok) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        seg *p = realloc(v->p, cap * sizeof *p);
        if (!p) return CN_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (seg){a, b, tok};
    return CN_OK;
}

static int prev_char_is(const char *s, size_t at, int (*pred)(uint32_t)) {
    if (at == 0) return 0;
    size_t j = at - 1, k;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80) j--;
    return pred(tok_utf8_get(s + j, at - j, &k));
}

static int next_char_is(const char *s, size_t at, size_t n, int (*pred)(uint32_t)) {
    size_t k;
    return at < n && pred(tok_utf8_get(s + at, n - at, &k));
}

/* AddedVocabulary::find_matches: segments of s, added tokens (leftmost longest) and the text
 * between them. */
static int find_added(const cn_tokenizer *t, const tok_trie *tr, const char *s, size_t n, int parse_special,
                      segs *out) {
    out->n = 0;
    size_t start_offset = 0;
    for (size_t i = 0; i < n;) {
        int32_t node = tr->root[(unsigned char)s[i]], best = -1;
        size_t best_end = 0;
        for (size_t j = i; node >= 0;) {
            if (tr->node[node].token >= 0) {
                best = tr->node[node].token;
                best_end = j + 1;
            }
            if (++j >= n) break;
            int32_t c = tr->node[node].child;
            while (c >= 0 && tr->node[c].byte != (uint8_t)s[j]) c = tr->node[c].sibling;
            node = c;
        }
        if (best < 0) {
            i++;
            continue;
        }
        const tok_added *x = &t->added[best];
        size_t start = i, stop = best_end;
        i = best_end; /* matches never overlap, skipped ones included */
        if (x->special && !parse_special) continue;
        if (x->single_word && (prev_char_is(s, start, tok_is_word) || next_char_is(s, stop, n, tok_is_word)))
            continue;
        if (x->lstrip) {
            size_t ns = start;
            while (ns > 0 && prev_char_is(s, ns, tok_is_space)) {
                ns--;
                while (ns > 0 && ((unsigned char)s[ns] & 0xc0) == 0x80) ns--;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (x->rstrip) {
            size_t k;
            while (stop < n && tok_is_space(tok_utf8_get(s + stop, n - stop, &k))) stop += k;
        }
        if (start_offset < start && seg_push(out, start_offset, start, -1)) return CN_ENOMEM;
        if (seg_push(out, start, stop, best)) return CN_ENOMEM;
        start_offset = stop;
    }
    if (start_offset < n && seg_push(out, start_offset, n, -1)) return CN_ENOMEM;
    return CN_OK;
}

int cn_tok_encode(const cn_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n,
                  cn_err *err) {
    *ids = NULL;
    *n = 0;
    size_t bad = tok_utf8_check(text, len);
    if (bad != len)
        return cn_err_set(err, CN_EINVAL, "text is not valid UTF-8 (byte 0x%02x at offset %zu)",
                          (unsigned char)text[bad], bad);
    int parse_special = (flags & CN_TOK_PARSE_SPECIAL) != 0;
    tok_ids out = {0};
    segs raw = {0}, nseg = {0};
    tok_buf nb = {0};
    tok_scratch *sc = tok_scratch_new(t);
    int rc = CN_OK;
    if (!sc) goto oom;
    if ((flags & CN_TOK_ADD_SPECIAL) && tok_ids_put(&out, t->post_prefix, (size_t)t->n_post_prefix)) goto oom;
    if (find_added(t, &t->trie_raw, text, len, parse_special, &raw)) goto oom;
    for (size_t i = 0; i < raw.n && rc == CN_OK; i++) {
        seg r = raw.p[i];
        if (r.tok >= 0) {
            if (tok_ids_push(&out, t->added[r.tok].id)) goto oom;
            continue;
        }
        const char *s = text + r.start;
        size_t sn = r.end - r.start;
        if (t->n_norm) {
            if ((rc = tok_normalize(t->norm, t->n_norm, s, sn, &nb, tok_scratch_rx(sc), err))) break;
            s = nb.p ? nb.p : "";
            sn = nb.n;
        }
        if (find_added(t, &t->trie_norm, s, sn, parse_special, &nseg)) goto oom;
        for (size_t j = 0; j < nseg.n && rc == CN_OK; j++) {
            seg q = nseg.p[j];
            if (q.tok >= 0) {
                if (tok_ids_push(&out, t->added[q.tok].id)) goto oom;
            } else {
                rc = tok_pretokenize_encode(t, s + q.start, q.end - q.start, r.start == 0 && q.start == 0, sc,
                                            &out, err);
            }
        }
    }
    if (rc == CN_OK && (flags & CN_TOK_ADD_SPECIAL) &&
        tok_ids_put(&out, t->post_suffix, (size_t)t->n_post_suffix))
        goto oom;
    if (rc == CN_OK && !out.p && !(out.p = malloc(sizeof *out.p))) goto oom;
    goto done;
oom:
    rc = cn_err_set(err, CN_ENOMEM, "out of memory");
done:
    tok_scratch_free(sc);
    free(raw.p);
    free(nseg.p);
    tok_buf_free(&nb);
    if (rc) {
        free(out.p);
        return rc;
    }
    *ids = out.p;
    *n = out.n;
    return CN_OK;
}

/* ---- lookups -------------------------------------------------------------------------------- */

int cn_tok_vocab_size(const cn_tokenizer *t) { return t->n_ids; }

int32_t cn_tok_token_to_id(const cn_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    return tok_vocab_get(t, token, n);
}

const char *cn_tok_id_to_token(const cn_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->str[id] : NULL;
}

int cn_tok_is_special(const cn_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->added_of[id] < 0) return 0;
    const tok_added *x = &t->added[t->added_of[id]];
    /* HF checks the spelling decode uses against the special set: a normalized form that differs
     * from the content is not in it */
    return x->special && !x->norm;
}

int cn_tok_is_lossless(const cn_tokenizer *t) { return t->lossless; }
