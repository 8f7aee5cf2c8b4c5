/* tokenizer.h - Hugging Face `tokenizer.json` tokenizers: text to token ids and back.
 *
 * Promises: for the BPE tokenizers it loads (byte-level GPT-2 style, and byte-fallback/Metaspace
 * SentencePiece style), cn_tok_encode gives the ids Hugging Face `tokenizers` gives with
 * `encode(text, add_special_tokens=...)`, and cn_tok_decode the text `decode(ids)` gives. The
 * pipeline is the one the file describes: added tokens are cut out of the text first (leftmost
 * longest, honouring single_word / lstrip / rstrip / normalized), then normalizer, pre-tokenizer,
 * BPE model, and on request the post-processor's template; decoding runs the decoder chain.
 * Never: WordPiece, Unigram or WordLevel models (a load names the kind and fails with
 * CN_EUNSUPPORTED), BPE dropout other than null/0, offsets, truncation or padding, pair inputs.
 *
 * Invariants:
 *  (1) A tokenizer is immutable after cn_tok_load; every function taking a const cn_tokenizer is
 *      safe to call from many threads at once. Encoding allocates its scratch (buffers, regex match
 *      data, a word cache) per call: there is no shared cache and no lock.
 *  (2) Text in and out is UTF-8. Invalid UTF-8 given to cn_tok_encode is an error (CN_EINVAL,
 *      naming the byte offset), never silently replaced.
 *  (3) A stream decoder emits only whole UTF-8 characters, and the concatenation of everything it
 *      emits (feed... then flush) equals cn_tok_decode of the same ids with the same flags.
 * Errors are 0 or a negative CN_E code with a message in the cn_err naming the problem.
 */
#ifndef CN_TOKENIZER_H
#define CN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct cn_tokenizer cn_tokenizer; /* layout: tok_impl.h */

/* cn_tok_encode flags. */
enum {
    /* Recognise special added tokens written in the text (Hugging Face's default). Without it
     * they are plain text, as with HF's `encode_special_tokens = True`; non-special added tokens
     * are still recognised, as HF does. */
    CN_TOK_PARSE_SPECIAL = 1 << 0,
    /* Add the post-processor's special tokens (BOS/EOS of its template). */
    CN_TOK_ADD_SPECIAL = 1 << 1,
};

/* cn_tok_decode / stream flags. */
enum {
    CN_TOK_SKIP_SPECIAL = 1 << 0, /* drop special added tokens, as decode(skip_special_tokens) */
};

/* Loads a tokenizer.json file. On error *out is NULL. Codes: CN_ENOENT/CN_EIO (file), CN_EFORMAT
 * (not JSON, missing or malformed fields), CN_EUNSUPPORTED (a model, normalizer, pre-tokenizer,
 * post-processor or decoder kind this module does not implement; the message names it). */
int cn_tok_load(cn_tokenizer **out, const char *path, cn_err *err);
/* The same from the file's text (len bytes, need not be NUL-terminated). */
int cn_tok_load_json(cn_tokenizer **out, const char *json, size_t len, cn_err *err);
void cn_tok_free(cn_tokenizer *t);

/* Encodes len bytes of UTF-8 text. *ids is malloc'd (caller frees; never NULL on success, even
 * for no tokens) and holds *n ids. On error *ids is NULL and *n 0. */
int cn_tok_encode(const cn_tokenizer *t, const char *text, size_t len, int flags,
                  int32_t **ids,  /* OUT */
                  size_t *n,      /* OUT */
                  cn_err *err);

/* Decodes n ids into malloc'd, NUL-terminated UTF-8 (*len bytes, without the NUL). An id outside
 * the vocabulary is CN_ERANGE (Hugging Face would drop it silently). */
int cn_tok_decode(const cn_tokenizer *t, const int32_t *ids, size_t n, int flags,
                  char **text,    /* OUT */
                  size_t *len,    /* OUT */
                  cn_err *err);

/* Streaming decoder: feed ids one at a time, get text as soon as it is final. Holds back an
 * incomplete UTF-8 sequence, an open run of byte-fallback <0xNN> tokens, and whatever a decoder
 * may still change (e.g. trailing characters a Strip decoder might remove). */
typedef struct cn_tok_stream {
    const cn_tokenizer *tok;
    int flags;
    void *state; /* private */
} cn_tok_stream;

/* Returns 0 or CN_ENOMEM. */
int cn_tok_stream_init(cn_tok_stream *s, const cn_tokenizer *t, int flags);
/* Appends the text that became final to out[0..*out_len) (a malloc'd buffer the stream owns and
 * reuses; valid until the next call). Returns 0, CN_ERANGE for an unknown id, CN_ENOMEM. */
int cn_tok_stream_feed(cn_tok_stream *s, int32_t id, const char **out, size_t *out_len, cn_err *err);
/* Ends the stream: returns what was held back. The stream can be fed again afterwards as a
 * fresh sequence. */
int cn_tok_stream_flush(cn_tok_stream *s, const char **out, size_t *out_len, cn_err *err);
void cn_tok_stream_free(cn_tok_stream *s);

/* Ids span [0, vocab_size): the model's vocabulary and the added tokens together. */
int cn_tok_vocab_size(const cn_tokenizer *t);
/* The id of a token spelled exactly so (added tokens first, then the model's vocabulary), or -1. */
int32_t cn_tok_token_to_id(const cn_tokenizer *t, const char *token);
/* The spelling of an id (NUL-terminated, owned by the tokenizer), or NULL if out of range/unused. */
const char *cn_tok_id_to_token(const cn_tokenizer *t, int32_t id);
/* 1 if id is a special added token, else 0. */
int cn_tok_is_special(const cn_tokenizer *t, int32_t id);
/* The bytes one token adds in the middle of a decoded stream (ByteLevel bytes, a <0xNN> byte,
 * Metaspace's marker as a space, Replace applied; never the neighbour-dependent rules), which may
 * be an incomplete UTF-8 character. *bytes is malloc'd (caller frees). Returns 0, CN_ERANGE for
 * an id outside the vocabulary, CN_ENOMEM. Constrained decoding masks tokens by these bytes. */
int cn_tok_token_bytes(const cn_tokenizer *t, int32_t id, char **bytes, size_t *n);
/* 1 if decode(encode(x)) == x for every valid UTF-8 x (no normalizer changes text, no unknown
 * token drops it, the decoder inverts the pre-tokenizer); a heuristic from the loaded kinds. */
int cn_tok_is_lossless(const cn_tokenizer *t);

#endif
