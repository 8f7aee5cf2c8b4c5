/* json_constraint.h - an incremental JSON recogniser over bytes, optionally held to a JSON schema:
 * it says whether more bytes keep the output a prefix of a valid value, and when the value is
 * complete.
 *
 * Structured output (Ollama `format`, OpenAI `response_format`) and the values of forced tool calls
 * mask the tokens whose bytes it refuses (constraint.h). It promises:
 *   (1) Every byte string it accepts is a prefix of some JSON text (RFC 8259, UTF-8) that satisfies
 *       the schema, and from every accepted prefix such a completion exists (no dead ends); once
 *       accepting() says 1, the bytes so far are one such text.
 *   (2) Checking bytes never changes the committed state: a cn_jc_sim overlays it, copying only the
 *       frames it touches, so checking n bytes costs O(n) whatever the nesting.
 *   (3) Output is bounded where JSON would let it run on without meaning: whitespace runs are at
 *       most CN_JC_MAX_WS bytes, integer and fraction parts at most CN_JC_MAX_DIGITS digits, an
 *       exponent at most 3, nesting at most CN_JC_MAX_DEPTH; nothing may follow the root value.
 * Schemas (draft 2020-12 keywords): type (a name or a list) object / array / string / number /
 * integer / boolean / null, properties, required, additionalProperties (false only), items, enum,
 * const, minLength / maxLength (characters), minItems / maxItems, and anyOf / oneOf whose branches
 * start with different bytes (different JSON types: Optional[X] is anyOf X, null), so that a
 * value's first byte picks its branch; local $ref into $defs / definitions (as pydantic writes
 * nested models), expanded where used, so a schema that refers to itself is refused. Annotations (title, description,
 * $schema, $id, $comment, default, examples, deprecated, readOnly, writeOnly) are ignored; any other
 * keyword is refused, naming it and where it sits. An object with properties takes only those keys,
 * each at most once, in any order, and closes only once every required key is in. An enum or const
 * value must be written as cJSON prints it (compact). Without properties an object takes any keys.
 * It never allocates while recognising and never exits.
 */
#ifndef CN_TEXT_JSON_CONSTRAINT_H
#define CN_TEXT_JSON_CONSTRAINT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/error.h"

#define CN_JC_MAX_DEPTH 32
#define CN_JC_MAX_WS 20
#define CN_JC_MAX_DIGITS 20

/* Compiled schemas; one store may hold several roots (a tool's parameters). Layout: json_constraint.c */
typedef struct cn_jc_schema cn_jc_schema;

/* Node 0 of every store is "any JSON value". Returns 0 or CN_ENOMEM. */
int cn_jc_schema_new(cn_jc_schema **out);
void cn_jc_schema_free(cn_jc_schema *s);
/* Compiles schema (NULL: any JSON object, what Ollama's "json" and OpenAI's json_object ask)
 * into s; *node gets the root. Returns 0, CN_ENOMEM, or CN_EUNSUPPORTED / CN_EINVAL with err
 * naming the keyword and its path (s keeps what it compiled; nothing refers to it). */
int cn_jc_schema_add(cn_jc_schema *s, const cJSON *schema, int *node, cn_err *err);
/* 1 if a value of node may be a string (its type allows one, or it has no type), 0 otherwise;
 * *min_len / *max_len get its length bounds (-1: none). Tool calls write strings raw. */
int cn_jc_node_is_string(const cn_jc_schema *s, int node, int *min_len, int *max_len);
/* 1 if node has an enum (or const) whose values are all strings. */
int cn_jc_node_string_enum(const cn_jc_schema *s, int node, int *n_values);

typedef struct cn_jc_frame {
    uint8_t kind, st;  /* what is being read, and where in it */
    uint8_t lo, hi;    /* string: range of the next UTF-8 continuation byte */
    int32_t node;      /* schema node */
    int32_t n;         /* array: items; string: characters; number: digits of this part;
                        * literal: bytes matched; object: property being read (-1: none) */
    int32_t aux;       /* string: hex digits or continuation bytes still due */
    uint64_t mask;     /* object: properties seen; literal: candidates left */
} cn_jc_frame;

/* The committed state: caller-allocated, filled by cn_jc_init. */
typedef struct cn_jc {
    const cn_jc_schema *s; /* not owned */
    int depth;             /* frames in st */
    int ws;                /* whitespace bytes in the current run */
    int done;              /* the root value closed: nothing may follow */
    cn_jc_frame st[CN_JC_MAX_DEPTH];
} cn_jc;

/* A trial run over a committed state (which must not change while the sim lives). */
typedef struct cn_jc_sim {
    const cn_jc *base;
    int nbase, nloc, ws, done;
    cn_jc_frame loc[CN_JC_MAX_DEPTH]; /* frames above base->st[0, nbase), touched ones only */
} cn_jc_sim;

/* Expects one value of node (a root from cn_jc_schema_add, or 0). This function can't fail. */
void cn_jc_init(cn_jc *r, const cn_jc_schema *s, int node);

void cn_jc_sim_begin(cn_jc_sim *m, const cn_jc *r);
/* 1 if the byte keeps the output valid (the sim advanced), 0 if refused (the sim is then
 * unusable: begin again). */
int cn_jc_sim_byte(cn_jc_sim *m, unsigned char b);
/* Writes the sim's state into dst (which may be the sim's base, or another cn_jc). */
void cn_jc_sim_commit(const cn_jc_sim *m, cn_jc *dst);
/* 1 if the bytes so far are a complete value (an end may come now). */
int cn_jc_sim_accepting(const cn_jc_sim *m);
/* Characters of plain string text the sim takes next without leaving the string (a string's body
 * with no escape or character open), or -1 when not inside one. */
int cn_jc_sim_plain_room(const cn_jc_sim *m);

/* Conveniences over a sim: 1 if all n bytes are taken (r unchanged by check, advanced by feed;
 * a refused feed leaves r unchanged). */
int cn_jc_check(const cn_jc *r, const char *b, size_t n);
int cn_jc_feed(cn_jc *r, const char *b, size_t n);
int cn_jc_accepting(const cn_jc *r);
/* 1 when nothing may follow (the root value closed). */
int cn_jc_finished(const cn_jc *r);

#endif
