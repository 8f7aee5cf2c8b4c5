/* tok_impl.h - the layout of a loaded tokenizer, shared by the tok_*.c files only.
 *
 * Lifetimes: everything in cn_tokenizer is built by cn_tok_load and read-only afterwards (see
 * tokenizer.h, invariant 1). Per-call scratch (tok_buf, tok_ids, tok_scratch) belongs to one
 * cn_tok_encode call or one stream.
 *
 * Strings are byte ranges (pointer + length), UTF-8 unless said otherwise; text may contain NUL.
 */
#ifndef CN_TOK_IMPL_H
#define CN_TOK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/error.h"
#include "text/tokenizer.h"

/* ---- growable buffers ----------------------------------------------------------------------- */

typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;

typedef struct tok_ids {
    int32_t *p;
    size_t n, cap;
} tok_ids;

int tok_buf_reserve(tok_buf *b, size_t extra); /* 0 or CN_ENOMEM */
int tok_buf_put(tok_buf *b, const void *s, size_t n);
int tok_buf_putc(tok_buf *b, char c);
int tok_buf_put_cp(tok_buf *b, uint32_t cp); /* UTF-8 encoding of a code point */
void tok_buf_free(tok_buf *b);
int tok_ids_push(tok_ids *v, int32_t id);
int tok_ids_put(tok_ids *v, const int32_t *ids, size_t n);

/* ---- UTF-8 and Unicode classes (properties from utf8proc) ----------------------------------- */

/* Length of the (valid) sequence starting at s[0], 1 for a stray byte. */
size_t tok_utf8_clen(unsigned char lead);
/* Decodes the valid character at s (n >= 1 bytes); *adv gets its length. */
uint32_t tok_utf8_get(const char *s, size_t n, size_t *adv);
/* Offset of the first byte that breaks UTF-8 (overlong, surrogate, > U+10FFFF, truncated), or n. */
size_t tok_utf8_check(const char *s, size_t n);
int tok_is_space(uint32_t cp);   /* Unicode White_Space, as Rust's char::is_whitespace */
int tok_is_word(uint32_t cp);    /* \w: letters, marks, decimal digits, connector punctuation */
int tok_is_numeric(uint32_t cp); /* general category N*, as Rust's char::is_numeric */

uint64_t tok_hash(const void *s, size_t n);

/* GPT-2 bytes_to_unicode: the code point each byte is spelled with, and back (-1: not in it). */
void tok_byte_alphabet(uint32_t cp_of_byte[256]);

/* ---- patterns: a regex (PCRE2, UTF + UCP, JIT when it compiles) or a character class -------- */

typedef enum tok_pat_kind {
    TOK_PAT_REGEX,   /* re */
    TOK_PAT_CHAR,    /* one code point: cp */
    TOK_PAT_NUMERIC, /* any char::is_numeric */
    TOK_PAT_SPACE,   /* any char::is_whitespace */
} tok_pat_kind;

typedef struct tok_pattern {
    tok_pat_kind kind;
    uint32_t cp;
    pcre2_code *re;
    int jit; /* pcre2_jit_compile succeeded */
} tok_pattern;

/* One piece of a split: [start, end) and whether it matched the pattern. */
typedef struct tok_span {
    size_t start, end;
    int match;
} tok_span;

typedef struct tok_spans {
    tok_span *p;
    size_t n, cap;
} tok_spans;

/* Per-call regex scratch: match data and a JIT stack (created lazily, freed by the owner). */
typedef struct tok_rx_scratch {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
} tok_rx_scratch;

/* Compiles `pattern` (len bytes). literal: match the text as it is (a JSON {"String": ...}).
 * Onig (which Hugging Face uses) counts U+0085 as \s and PCRE2 does not; regexes are rewritten
 * so both agree. Returns 0, CN_EFORMAT (bad regex, message names it). */
int tok_pattern_regex(tok_pattern *p, const char *pattern, size_t len, int literal, cn_err *err);
void tok_pattern_free(tok_pattern *p);
/* Hugging Face's find_matches: spans covering s[0..n) in order, matches and gaps; an empty s
 * gives one empty gap. Regex matches follow onig's find_iter (an empty match right after a
 * match is skipped). Returns 0, CN_ENOMEM, CN_EINVAL (regex engine error). */
int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, tok_rx_scratch *rx,
                     tok_spans *out, cn_err *err);
void tok_rx_scratch_free(tok_rx_scratch *rx);

/* Split behaviours (SplitDelimiterBehavior). */
typedef enum tok_behavior {
    TOK_REMOVED,
    TOK_ISOLATED,
    TOK_MERGED_PREV,
    TOK_MERGED_NEXT,
    TOK_CONTIGUOUS,
} tok_behavior;

/* Applies a behaviour (after inverting matches if invert) in place: spans become the pieces to
 * keep (match = 0 on all of them), empty ones included (callers drop them). */
void tok_apply_behavior(tok_spans *sp, tok_behavior b, int invert);

/* ---- normalizers ---------------------------------------------------------------------------- */

typedef enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_REPLACE, /* pat -> str */
    TOK_NORM_PREPEND, /* str, only to a non-empty string */
    TOK_NORM_STRIP,   /* left / right whitespace */
} tok_norm_kind;

typedef struct tok_norm {
    tok_norm_kind kind;
    tok_pattern pat;
    char *str;
    size_t str_len;
    int left, right;
} tok_norm;

/* Runs the normalizers (a flattened Sequence) over s[0..n), the result in out (cleared first). */
int tok_normalize(const tok_norm *ns, int n_norm, const char *s, size_t n, tok_buf *out,
                  tok_rx_scratch *rx, cn_err *err);

/* ---- pre-tokenizers ------------------------------------------------------------------------- */

typedef enum tok_pretok_kind {
    TOK_PT_BYTELEVEL,
    TOK_PT_SPLIT,
    TOK_PT_DIGITS,
    TOK_PT_METASPACE,
    TOK_PT_WHITESPACE,       /* \w+|[^\w\s]+, the rest removed */
    TOK_PT_WHITESPACE_SPLIT, /* split on whitespace, removed */
} tok_pretok_kind;

typedef enum tok_prepend {
    TOK_PREPEND_ALWAYS,
    TOK_PREPEND_FIRST,
    TOK_PREPEND_NEVER,
} tok_prepend;

typedef struct tok_pretok {
    tok_pretok_kind kind;
    tok_pattern pat; /* Split, ByteLevel (GPT-2 regex when use_regex), Whitespace */
    tok_behavior behavior;
    int invert;
    int add_prefix_space, use_regex; /* ByteLevel */
    int individual;                  /* Digits */
    uint32_t repl_cp;                /* Metaspace replacement */
    char repl[8];
    size_t repl_len;
    tok_prepend prepend; /* Metaspace */
    int split;           /* Metaspace */
} tok_pretok;

/* ---- BPE model -------------------------------------------------------------------------------- */

typedef struct tok_bpe {
    /* merges: (left id, right id) -> (rank, merged id); open addressing, key 0 = empty slot
     * (key is (left+1) << 32 | (right+1) so that no real pair is 0) */
    uint64_t *mkey;
    uint32_t *mrank;
    int32_t *mnew;
    size_t mmask;
    int32_t unk_id; /* -1: no unk_token (unknown characters are dropped, as HF does) */
    const char *unk_token;
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix, NULL if none */
    size_t prefix_len, suffix_len;
    int32_t byte_tok[256]; /* id of "<0xNN>" or -1 */
} tok_bpe;

/* Per-call BPE scratch. */
typedef struct tok_bpe_scratch {
    struct tok_sym *sym;
    size_t sym_cap;
    struct tok_merge *heap;
    size_t heap_cap;
    tok_buf tmp;
} tok_bpe_scratch;

struct cn_tokenizer;
/* Appends the ids of one pre-token (word) to out. */
int tok_bpe_word(const struct cn_tokenizer *t, const char *w, size_t n, tok_bpe_scratch *sc,
                 tok_ids *out, cn_err *err);
void tok_bpe_scratch_free(tok_bpe_scratch *sc);
/* Builds the merge table; merges given as pairs of token strings. */
int tok_bpe_add_merge(struct cn_tokenizer *t, const char *a, size_t la, const char *b, size_t lb,
                      uint32_t rank, cn_err *err);

/* ---- decoders ------------------------------------------------------------------------------- */

typedef enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_METASPACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_REPLACE,
} tok_dec_kind;

typedef struct tok_dec {
    tok_dec_kind kind;
    uint32_t cp;   /* Metaspace replacement, Strip content */
    tok_prepend prepend;
    int start, stop; /* Strip */
    char *pat, *str; /* Replace: literal pattern -> str */
    size_t pat_len, str_len;
} tok_dec;

/* ---- added tokens --------------------------------------------------------------------------- */

typedef struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    char *norm; /* content after the normalizer, when normalized and it differs; else NULL */
    size_t norm_len;
    unsigned single_word : 1, lstrip : 1, rstrip : 1, normalized : 1, special : 1;
} tok_added;

/* Byte trie over added-token spellings, for leftmost-longest matching. */
typedef struct tok_trie_node {
    int32_t child;   /* first child, -1 */
    int32_t sibling; /* next sibling, -1 */
    int32_t token;   /* index into added[], -1 */
    uint8_t byte;
} tok_trie_node;

typedef struct tok_trie {
    tok_trie_node *node;
    size_t n, cap;
    int32_t root[256]; /* child of the root per first byte, -1 */
} tok_trie;

/* ---- the tokenizer -------------------------------------------------------------------------- */

struct cn_tokenizer {
    /* vocabulary: id -> spelling (NUL-terminated, in pool or owned by added[]); n_ids = max id + 1 */
    const char **str;
    uint32_t *len;
    int32_t n_ids;
    char *pool; /* the model vocabulary's spellings */
    /* model vocabulary lookup: slot -> id + 1 (0 empty), by tok_hash of the spelling */
    uint32_t *vslot;
    size_t vmask;
    uint8_t *is_added;   /* [n_ids]: 1 if the id is an added token */
    int32_t *added_of;   /* [n_ids]: index into added[], -1 */
    tok_added *added;
    int n_added;
    tok_trie trie_raw, trie_norm; /* normalized = false / true */
    tok_bpe bpe;
    tok_norm *norm;
    int n_norm;
    tok_pretok *pretok;
    int n_pretok;
    tok_dec *dec;
    int n_dec;
    int has_decoder;
    int32_t *post_prefix, *post_suffix; /* ids the post-processor adds around a single sequence */
    int n_post_prefix, n_post_suffix;
    int lossless;
    char bl_str[256][3]; /* ByteLevel: UTF-8 spelling of each byte (bl_len bytes) */
    uint8_t bl_len[256];
    int16_t bl_byte[0x144]; /* ByteLevel decoding: code point -> byte, -1 if none */
};

/* Model-vocabulary lookup (no added tokens): id or -1. */
int32_t tok_vocab_get(const struct cn_tokenizer *t, const char *s, size_t n);

/* Pre-tokenizes s through pretok[level..] and BPE-encodes every piece into out. orig0: the piece
 * starts at the text's first byte (Metaspace prepend_scheme "first"). */
typedef struct tok_scratch tok_scratch;
int tok_pretokenize_encode(const struct cn_tokenizer *t, const char *s, size_t n, int orig0,
                           tok_scratch *sc, tok_ids *out, cn_err *err);
tok_scratch *tok_scratch_new(const struct cn_tokenizer *t);
void tok_scratch_free(tok_scratch *sc);
tok_rx_scratch *tok_scratch_rx(tok_scratch *sc);

#endif
