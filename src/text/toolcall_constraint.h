/* toolcall_constraint.h - a byte recogniser for one forced tool call in the template's XML format:
 *
 *     ws{0,4} <tool_call>\n<function=NAME>\n
 *             ( <parameter=KEY>\nVALUE\n</parameter>\n )*
 *             </function>\n</tool_call>
 *
 * NAME is one of the offered tools (or the one named); each KEY is a property of that tool's
 * parameters, at most once, and the call closes only once every required key is in. VALUE follows
 * the property's schema as parser.h / toolcall.h read it back: a property that may be a string (or
 * has no schema) is raw text, never containing "</" (so it cannot end the value or the call early)
 * and within its minLength / maxLength; a string enum is one of its values, raw; anything else is
 * JSON held to the schema by json_constraint.h. It promises that every accepted prefix can be
 * completed, and that a completed call is one the parser returns as a TOOL_CALL of that name with
 * the arguments typed as the schema says. It never allocates while recognising and never exits.
 */
#ifndef CN_TEXT_TOOLCALL_CONSTRAINT_H
#define CN_TEXT_TOOLCALL_CONSTRAINT_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "base/error.h"
#include "text/json_constraint.h"

typedef struct cn_tcc_spec cn_tcc_spec; /* layout: toolcall_constraint.c */

/* Compiles tools (an OpenAI tools array) for a forced call; only (NULL: any of them) restricts it
 * to one name. Returns 0, CN_ENOMEM, or CN_EINVAL / CN_EUNSUPPORTED with err naming the tool and
 * the schema keyword (an unknown only names no tool). */
int cn_tcc_spec_new(cn_tcc_spec **out, const cJSON *tools, const char *only, cn_err *err);
void cn_tcc_spec_free(cn_tcc_spec *sp);

typedef struct cn_tcc_sc {
    int phase;
    int off;          /* literal: bytes matched */
    int ws;           /* leading whitespace */
    int fn, key;      /* the tool chosen, the parameter being written */
    uint64_t mask;    /* literal: candidates left */
    uint64_t seen;    /* parameters written */
    int tp;           /* raw: bytes of "\n</parameter>\n" matched */
    int chars;        /* raw: characters of the value */
    int lt;           /* raw: the last content byte was '<' */
    int u8;           /* raw: continuation bytes due */
    int lo, hi;       /* raw: range of the next continuation byte */
} cn_tcc_sc;

typedef struct cn_tcc {
    const cn_tcc_spec *sp; /* not owned */
    cn_tcc_sc sc;
    cn_jc jc;              /* a JSON value being written */
} cn_tcc;

typedef struct cn_tcc_sim {
    const cn_tcc *base;
    cn_tcc_sc sc;
    int jmode;        /* 0: no JSON value; 1: js overlays base->jc; 2: js overlays fresh */
    cn_jc_sim js;
    cn_jc fresh;
} cn_tcc_sim;

void cn_tcc_init(cn_tcc *r, const cn_tcc_spec *sp);
void cn_tcc_sim_begin(cn_tcc_sim *m, const cn_tcc *r);
/* 1 if taken, 0 if refused (the sim is then unusable). */
int cn_tcc_sim_byte(cn_tcc_sim *m, unsigned char b);
void cn_tcc_sim_commit(const cn_tcc_sim *m, cn_tcc *dst);
/* Characters of plain text the sim takes next without leaving a JSON string, or -1. */
int cn_tcc_sim_plain_room(const cn_tcc_sim *m);
/* Characters of raw text (no '<', newline or NUL; whole characters) the sim takes next inside a
 * raw value, or -1 when not inside one with nothing pending. */
int cn_tcc_sim_raw_room(const cn_tcc_sim *m);

int cn_tcc_check(const cn_tcc *r, const char *b, size_t n);
int cn_tcc_feed(cn_tcc *r, const char *b, size_t n);
/* 1 once the call closed (nothing may follow). */
int cn_tcc_finished(const cn_tcc *r);
/* 1 where the template's special tokens (<tool_call>, ...) may stand for their text: outside values. */
int cn_tcc_specials_ok(const cn_tcc *r);

#endif
