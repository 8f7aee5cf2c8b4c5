/* pyjson.h - JSON read the way Python's json.loads reads it, printed the way Python prints it.
 *
 * Chat templates are rendered by jinja2 over the Python values json.loads made from the request,
 * and they print those values with str() (`| string`, `~`), `| trim` and json.dumps (`| tojson`).
 * To reproduce a template byte for byte in C this module keeps what a plain cJSON parse loses and
 * prints values with Python's rules. It promises:
 *   (1) cn_pyjson_parse accepts RFC 8259 JSON in valid UTF-8 and nothing else: no comments, no
 *       trailing commas, no NaN/Infinity literals (Python accepts those three; clients never send
 *       them), no unescaped control characters in strings, no lone surrogate escapes. U+0000 is
 *       refused because cJSON strings end at a NUL.
 *   (2) Every number node keeps its literal in `valuestring` (freed by cJSON_Delete, copied by
 *       cJSON_Duplicate). A literal without '.', 'e' or 'E' is a Python int and prints as its
 *       digits, whatever its size ("-0" prints as 0); any other is a float and prints as
 *       Python's repr of the nearest double: 1.0, 1e-05, 0.1, 1e+16, inf.
 *       Number nodes made elsewhere (no literal) print as ints when integral and below 2^53.
 *   (3) Object members keep document order; a repeated key keeps its first position and takes
 *       the last value, as Python's dict does.
 *   (4) cn_py_str is str(), cn_py_repr is repr(), cn_py_dumps is json.dumps(x, ensure_ascii=False)
 *       with the default ", " and ": " separators (Hugging Face's tojson filter).
 * Limits: repr() escapes the non-printable code points Python escapes for the categories
 * Cc, Cf, Co, Zl, Zp, Zs and the noncharacters; unassigned code points (Cn) other than
 * noncharacters print raw where Python would escape them.
 * Nothing here exits, logs or keeps state between calls.
 */
#ifndef CN_PYJSON_H
#define CN_PYJSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "base/error.h"
#include "text/strbuf.h"

/* Parses len bytes (no NUL needed) into *out (caller owns; cJSON_Delete). Returns 0,
 * CN_EFORMAT (not JSON, or not UTF-8: the message names the byte offset and what was expected),
 * CN_EINVAL (a string holds U+0000 or the nesting is deeper than 512) or CN_ENOMEM.
 * On error *out is untouched. */
int cn_pyjson_parse(const char *text, size_t len, cJSON **out, cn_err *err);

/* 1 if the bytes are well-formed UTF-8 (no overlong forms, surrogates or code points above
 * U+10FFFF); *bad_at gets the offset of the first bad byte otherwise. */
int cn_utf8_valid(const char *s, size_t n, size_t *bad_at);

/* Python str(v): strings raw, True/False/None, ints as digits, floats as repr, containers as
 * repr. */
void cn_py_str(cn_strbuf *b, const cJSON *v);
/* Python repr(v). */
void cn_py_repr(cn_strbuf *b, const cJSON *v);
/* json.dumps(v, ensure_ascii=False): ", " / ": " separators, key order kept, floats as repr,
 * inf/nan as Infinity/NaN. */
void cn_py_dumps(cn_strbuf *b, const cJSON *v);
/* 1 if the number node is a Python int (see (2)). */
int cn_py_is_int(const cJSON *num);

/* Python's repr of a double into out (at least 32 bytes): shortest digits that read back to x,
 * fixed notation for exponents -4 <= e < 16, else d.ddde+XX. Returns the length. */
int cn_py_float_repr(double x, char *out);

/* Python str.strip() with no argument: the bounds [*start, *end) of s[0..n) without leading and
 * trailing Unicode whitespace (str.isspace: \t\n\v\f\r, \x1c-\x1f, space, U+0085, U+00A0,
 * U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000). s must be valid UTF-8. */
void cn_py_strip(const char *s, size_t n, size_t *start, size_t *end);

#endif
