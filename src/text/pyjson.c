/* pyjson.c - strict JSON into cJSON with number literals kept; Python's str/repr/json.dumps.
 *
 * Why not cJSON_Parse: it stores numbers as doubles only (1.0 and 1 become the same, 2^64 loses
 * digits), keeps duplicate keys twice, does not check UTF-8 and accepts some non-JSON. Python
 * sees all of those differently, and a template prints what Python sees.
 */
#include "text/pyjson.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 512

/* ---------------------------------------------------------------- UTF-8 */

/* Decodes one code point at s[0..n) (which must be valid UTF-8); returns its byte length. */
static int utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    if (s[0] < 0x80 || n < 2) {
        *cp = s[0];
        return 1;
    }
    if (s[0] < 0xE0) {
        *cp = ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (s[0] < 0xF0 || n < 4) {
        *cp = ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
          ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

static int utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int cn_utf8_valid(const char *str, size_t n, size_t *bad_at) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t min, cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1, min = 0x80, cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2, min = 0x800, cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3, min = 0x10000, cp = c & 0x07;
        } else {
            goto bad;
        }
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) goto bad;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
        i += k + 1;
    }
    return 1;
bad:
    if (bad_at) *bad_at = i;
    return 0;
}

/* ---------------------------------------------------------------- parser */

typedef struct parser {
    const char *s;
    size_t n, i;
    int depth;
    cn_err *err;
} parser;

static int fail(parser *p, int code, const char *what) {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) {
        if (p->s[k] == '\n') line++, col = 1;
        else col++;
    }
    if (p->i >= p->n)
        return cn_err_set(p->err, code, "invalid JSON: %s at the end of the input (line %zu)", what,
                          line);
    return cn_err_set(p->err, code, "invalid JSON at byte %zu (line %zu, column %zu): %s", p->i,
                      line, col, what);
}

static void skip_ws(parser *p) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->i++;
    }
}

static int hex4(parser *p, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        if (p->i >= p->n) return fail(p, CN_EFORMAT, "truncated \\u escape");
        char c = p->s[p->i++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) {
            p->i--;
            return fail(p, CN_EFORMAT, "bad hex digit in \\u escape");
        }
        *v = (*v << 4) | (uint32_t)d;
    }
    return 0;
}

/* Parses a string at p->s[p->i] == '"' into a malloc'd NUL-terminated copy. */
static int parse_string(parser *p, char **out) {
    p->i++; /* opening quote */
    cn_strbuf b = CN_STRBUF_INIT;
    int rc;
    for (;;) {
        if (p->i >= p->n) {
            rc = fail(p, CN_EFORMAT, "unterminated string");
            goto err;
        }
        size_t run = p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' &&
               (unsigned char)p->s[p->i] >= 0x20)
            p->i++;
        cn_strbuf_put(&b, p->s + run, p->i - run);
        if (p->i >= p->n) continue;
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) {
            rc = fail(p, CN_EFORMAT, "unescaped control character in string");
            goto err;
        }
        p->i++; /* backslash */
        if (p->i >= p->n) continue;
        char e = p->s[p->i++];
        switch (e) {
        case '"': cn_strbuf_putc(&b, '"'); break;
        case '\\': cn_strbuf_putc(&b, '\\'); break;
        case '/': cn_strbuf_putc(&b, '/'); break;
        case 'b': cn_strbuf_putc(&b, '\b'); break;
        case 'f': cn_strbuf_putc(&b, '\f'); break;
        case 'n': cn_strbuf_putc(&b, '\n'); break;
        case 'r': cn_strbuf_putc(&b, '\r'); break;
        case 't': cn_strbuf_putc(&b, '\t'); break;
        case 'u': {
            uint32_t cp, lo;
            if ((rc = hex4(p, &cp))) goto err;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->i + 1 < p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                    p->i += 2;
                    if ((rc = hex4(p, &lo))) goto err;
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        rc = fail(p, CN_EFORMAT, "high surrogate escape not followed by a low one");
                        goto err;
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else {
                    rc = fail(p, CN_EFORMAT, "lone surrogate escape (not a Unicode character)");
                    goto err;
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                rc = fail(p, CN_EFORMAT, "lone surrogate escape (not a Unicode character)");
                goto err;
            } else if (cp == 0) {
                rc = fail(p, CN_EINVAL, "\\u0000 in a string is not supported");
                goto err;
            }
            char u[4];
            cn_strbuf_put(&b, u, (size_t)utf8_encode(cp, u));
            break;
        }
        default:
            p->i--;
            rc = fail(p, CN_EFORMAT, "unknown escape in string");
            goto err;
        }
    }
    return cn_strbuf_take(&b, out, NULL);
err:
    cn_strbuf_free(&b);
    return rc;
}

static int parse_value(parser *p, cJSON **out);

static cJSON *make_number(parser *p, size_t start, int *rc) {
    size_t n = p->i - start;
    char *lit = cJSON_malloc(n + 1);
    cJSON *v = NULL;
    if (!lit) goto oom;
    memcpy(lit, p->s + start, n);
    lit[n] = '\0';
    double d = strtod(lit, NULL); /* correctly rounded in glibc; overflow gives +-inf as Python */
    if (!(v = cJSON_CreateNumber(d))) goto oom;
    v->valuestring = lit;
    return v;
oom:
    cJSON_free(lit);
    *rc = cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
    return NULL;
}

static int parse_number(parser *p, cJSON **out) {
    size_t start = p->i;
#define DIGIT(k) ((k) < p->n && p->s[k] >= '0' && p->s[k] <= '9')
    if (p->s[p->i] == '-') p->i++;
    if (!DIGIT(p->i)) return fail(p, CN_EFORMAT, "expected a digit");
    if (p->s[p->i] == '0') {
        p->i++;
        if (DIGIT(p->i)) return fail(p, CN_EFORMAT, "leading zero in a number");
    } else {
        while (DIGIT(p->i)) p->i++;
    }
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (!DIGIT(p->i)) return fail(p, CN_EFORMAT, "expected a digit after '.'");
        while (DIGIT(p->i)) p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (!DIGIT(p->i)) return fail(p, CN_EFORMAT, "expected a digit in the exponent");
        while (DIGIT(p->i)) p->i++;
    }
#undef DIGIT
    int rc = 0;
    *out = make_number(p, start, &rc);
    return rc;
}

static int parse_container(parser *p, cJSON **out, int is_object) {
    if (++p->depth > MAX_DEPTH) return fail(p, CN_EINVAL, "nesting deeper than 512 levels");
    cJSON *c = is_object ? cJSON_CreateObject() : cJSON_CreateArray();
    char close = is_object ? '}' : ']';
    int rc;
    if (!c) return cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
    p->i++;
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        goto done;
    }
    for (;;) {
        char *key = NULL;
        cJSON *v = NULL;
        skip_ws(p);
        if (is_object) {
            if (p->i >= p->n || p->s[p->i] != '"') {
                rc = fail(p, CN_EFORMAT, "expected a string key");
                goto err;
            }
            if ((rc = parse_string(p, &key))) goto err;
            skip_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') {
                free(key);
                rc = fail(p, CN_EFORMAT, "expected ':' after the key");
                goto err;
            }
            p->i++;
        }
        if ((rc = parse_value(p, &v))) {
            free(key);
            goto err;
        }
        if (is_object) {
            /* Python dict semantics: a repeated key keeps its place, takes the new value. */
            int ok = cJSON_GetObjectItemCaseSensitive(c, key)
                         ? cJSON_ReplaceItemInObjectCaseSensitive(c, key, v)
                         : cJSON_AddItemToObject(c, key, v);
            free(key);
            if (!ok) {
                cJSON_Delete(v);
                rc = cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
                goto err;
            }
        } else if (!cJSON_AddItemToArray(c, v)) {
            cJSON_Delete(v);
            rc = cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
            goto err;
        }
        skip_ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            break;
        }
        rc = fail(p, CN_EFORMAT, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        goto err;
    }
done:
    p->depth--;
    *out = c;
    return 0;
err:
    cJSON_Delete(c);
    return rc;
}

static int literal(parser *p, const char *word, cJSON *(*make)(void), cJSON **out) {
    size_t n = strlen(word);
    if (p->n - p->i < n || memcmp(p->s + p->i, word, n) != 0)
        return fail(p, CN_EFORMAT, "expected a value");
    p->i += n;
    if (!(*out = make())) return cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
    return 0;
}

static cJSON *make_true(void) { return cJSON_CreateTrue(); }
static cJSON *make_false(void) { return cJSON_CreateFalse(); }
static cJSON *make_null(void) { return cJSON_CreateNull(); }

static int parse_value(parser *p, cJSON **out) {
    skip_ws(p);
    if (p->i >= p->n) return fail(p, CN_EFORMAT, "expected a value");
    char c = p->s[p->i];
    switch (c) {
    case '{': return parse_container(p, out, 1);
    case '[': return parse_container(p, out, 0);
    case '"': {
        char *s;
        int rc = parse_string(p, &s);
        if (rc) return rc;
        cJSON *v = cJSON_CreateString(s);
        free(s);
        if (!v) return cn_err_set(p->err, CN_ENOMEM, "out of memory parsing JSON");
        *out = v;
        return 0;
    }
    case 't': return literal(p, "true", make_true, out);
    case 'f': return literal(p, "false", make_false, out);
    case 'n': return literal(p, "null", make_null, out);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, out);
        return fail(p, CN_EFORMAT, "expected a value");
    }
}

int cn_pyjson_parse(const char *text, size_t len, cJSON **out, cn_err *err) {
    size_t bad;
    if (!cn_utf8_valid(text, len, &bad))
        return cn_err_set(err, CN_EFORMAT, "input is not valid UTF-8 (byte %zu)", bad);
    parser p = {text, len, 0, 0, err};
    cJSON *v = NULL;
    int rc = parse_value(&p, &v);
    if (rc) return rc;
    skip_ws(&p);
    if (p.i < p.n) {
        cJSON_Delete(v);
        return fail(&p, CN_EFORMAT, "extra data after the JSON value");
    }
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------- numbers */

int cn_py_is_int(const cJSON *num) {
    if (num->valuestring) return strpbrk(num->valuestring, ".eE") == NULL;
    double d = num->valuedouble;
    return isfinite(d) && d == floor(d) && fabs(d) < 9007199254740992.0;
}

/* The nearest decimal with p significant digits, as "d.ddd" digits (no point) and the exponent of
 * the first digit. */
static void digits_at(double ax, int p, char *dig, int *exp10) {
    char s[40];
    snprintf(s, sizeof s, "%.*e", p - 1, ax);
    int k = 0;
    const char *q = s;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[k++] = *q;
    dig[k] = '\0';
    *exp10 = atoi(q + 1);
}

static double digits_value(const char *dig, int exp10) {
    char s[48];
    snprintf(s, sizeof s, "%c.%se%d", dig[0], dig + 1, exp10);
    return strtod(s, NULL);
}

/* Shortest digits that read back to ax > 0 (finite). Python's repr picks, among the shortest
 * strings that round-trip, the one nearest the value. The nearest p-digit decimal is tried first;
 * near a power of two the rounding interval is lopsided, so the neighbour on the other side of
 * ax can round-trip when the nearest does not: it is tried second. */
static void shortest_digits(double ax, char *dig, int *exp10) {
    for (int p = 1; p <= 17; p++) {
        digits_at(ax, p, dig, exp10);
        double y = digits_value(dig, *exp10);
        if (y == ax) return;
        if (p == 17) break;
        char alt[24];
        int e = *exp10;
        memcpy(alt, dig, (size_t)p + 1);
        if (y < ax) { /* one unit up in the last place */
            int k = p - 1;
            while (k >= 0 && alt[k] == '9') alt[k--] = '0';
            if (k < 0) {
                alt[0] = '1';
                e++;
            } else {
                alt[k]++;
            }
        } else { /* one unit down */
            int k = p - 1;
            while (k >= 0 && alt[k] == '0') alt[k--] = '9';
            alt[k]--;
            if (alt[0] == '0') { /* 1.00eE - ulp: the largest p-digit number below, 9.99e(E-1) */
                memset(alt, '9', (size_t)p);
                e--;
            }
        }
        if (digits_value(alt, e) == ax) {
            memcpy(dig, alt, (size_t)p + 1);
            *exp10 = e;
            return;
        }
    }
    digits_at(ax, 17, dig, exp10); /* 17 digits always round-trip */
}

int cn_py_float_repr(double x, char *out) {
    if (isnan(x)) return sprintf(out, "nan");
    if (isinf(x)) return sprintf(out, x < 0 ? "-inf" : "inf");
    char *o = out;
    if (signbit(x)) *o++ = '-';
    double ax = fabs(x);
    if (ax == 0) return (int)(o - out) + sprintf(o, "0.0");
    char dig[24];
    int e;
    shortest_digits(ax, dig, &e);
    int n = (int)strlen(dig);
    while (n > 1 && dig[n - 1] == '0') dig[--n] = '\0';
    int decpt = e + 1; /* value = 0.DIGITS x 10^decpt */
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            o += sprintf(o, "0.");
            for (int k = 0; k < -decpt; k++) *o++ = '0';
            o += sprintf(o, "%s", dig);
        } else if (decpt < n) {
            memcpy(o, dig, (size_t)decpt);
            o += decpt;
            o += sprintf(o, ".%s", dig + decpt);
        } else {
            o += sprintf(o, "%s", dig);
            for (int k = n; k < decpt; k++) *o++ = '0';
            o += sprintf(o, ".0");
        }
    } else {
        *o++ = dig[0];
        if (n > 1) o += sprintf(o, ".%s", dig + 1);
        o += sprintf(o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
    *o = '\0';
    return (int)(o - out);
}

/* A number as Python prints it; json selects json.dumps' names for the non-finite floats. */
static void put_number(cn_strbuf *b, const cJSON *v, int json) {
    char s[40];
    if (cn_py_is_int(v)) {
        if (v->valuestring) {
            const char *lit = v->valuestring;
            cn_strbuf_puts(b, strcmp(lit, "-0") == 0 ? "0" : lit);
        } else {
            snprintf(s, sizeof s, "%.0f", v->valuedouble == 0 ? 0.0 : v->valuedouble);
            cn_strbuf_puts(b, s);
        }
        return;
    }
    double d = v->valuestring ? strtod(v->valuestring, NULL) : v->valuedouble;
    if (json && isnan(d)) cn_strbuf_puts(b, "NaN");
    else if (json && isinf(d)) cn_strbuf_puts(b, d < 0 ? "-Infinity" : "Infinity");
    else {
        cn_py_float_repr(d, s);
        cn_strbuf_puts(b, s);
    }
}

/* ---------------------------------------------------------------- strings */

static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* str.isprintable for one code point, within the limits stated in pyjson.h. */
static int py_isprintable(uint32_t c) {
    static const uint32_t ranges[][2] = {
        /* Cc */ {0x00, 0x1F}, {0x7F, 0x9F},
        /* Zs except space, Zl, Zp */ {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
        {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
        /* Cf */ {0xAD, 0xAD}, {0x600, 0x605}, {0x61C, 0x61C}, {0x6DD, 0x6DD}, {0x70F, 0x70F},
        {0x890, 0x891}, {0x8E2, 0x8E2}, {0x180E, 0x180E}, {0x200B, 0x200F}, {0x202A, 0x202E},
        {0x2060, 0x2064}, {0x2066, 0x206F}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB},
        {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
        {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
        /* Co */ {0xE000, 0xF8FF}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD},
        /* Cn: noncharacters */ {0xFDD0, 0xFDEF},
    };
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++)
        if (c >= ranges[k][0] && c <= ranges[k][1]) return 0;
    if ((c & 0xFFFE) == 0xFFFE) return 0; /* U+xFFFE, U+xFFFF */
    return 1;
}

void cn_py_strip(const char *s, size_t n, size_t *start, size_t *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, z = n;
    while (a < n) {
        uint32_t cp;
        int k = utf8_decode(u + a, n - a, &cp);
        if (!py_isspace(cp)) break;
        a += (size_t)k;
    }
    while (z > a) {
        size_t q = z - 1;
        while (q > a && (u[q] & 0xC0) == 0x80) q--; /* back to the lead byte */
        uint32_t cp;
        utf8_decode(u + q, z - q, &cp);
        if (!py_isspace(cp)) break;
        z = q;
    }
    *start = a;
    *end = z;
}

static void repr_string(cn_strbuf *b, const char *s) {
    char quote = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), i = 0;
    cn_strbuf_putc(b, quote);
    while (i < n) {
        uint32_t cp;
        int k = utf8_decode(u + i, n - i, &cp);
        char esc[16];
        if (cp == (uint32_t)quote || cp == '\\') {
            esc[0] = '\\', esc[1] = (char)cp;
            cn_strbuf_put(b, esc, 2);
        } else if (cp == '\t') cn_strbuf_puts(b, "\\t");
        else if (cp == '\n') cn_strbuf_puts(b, "\\n");
        else if (cp == '\r') cn_strbuf_puts(b, "\\r");
        else if (!py_isprintable(cp)) {
            if (cp < 0x100) snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000) snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            else snprintf(esc, sizeof esc, "\\U%08x", (unsigned)cp);
            cn_strbuf_puts(b, esc);
        } else {
            cn_strbuf_put(b, s + i, (size_t)k);
        }
        i += (size_t)k;
    }
    cn_strbuf_putc(b, quote);
}

static void json_string(cn_strbuf *b, const char *s) {
    cn_strbuf_putc(b, '"');
    size_t run = 0, i = 0;
    for (; s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        cn_strbuf_put(b, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': cn_strbuf_puts(b, "\\\""); break;
        case '\\': cn_strbuf_puts(b, "\\\\"); break;
        case '\n': cn_strbuf_puts(b, "\\n"); break;
        case '\r': cn_strbuf_puts(b, "\\r"); break;
        case '\t': cn_strbuf_puts(b, "\\t"); break;
        case '\b': cn_strbuf_puts(b, "\\b"); break;
        case '\f': cn_strbuf_puts(b, "\\f"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            cn_strbuf_puts(b, esc);
        }
    }
    cn_strbuf_put(b, s + run, i - run);
    cn_strbuf_putc(b, '"');
}

/* ---------------------------------------------------------------- str / repr / dumps */

enum { MODE_REPR, MODE_JSON };

static void print_value(cn_strbuf *b, const cJSON *v, int mode) {
    if (cJSON_IsString(v)) {
        if (mode == MODE_JSON) json_string(b, v->valuestring);
        else repr_string(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        put_number(b, v, mode == MODE_JSON);
    } else if (cJSON_IsTrue(v)) {
        cn_strbuf_puts(b, mode == MODE_JSON ? "true" : "True");
    } else if (cJSON_IsFalse(v)) {
        cn_strbuf_puts(b, mode == MODE_JSON ? "false" : "False");
    } else if (cJSON_IsNull(v)) {
        cn_strbuf_puts(b, mode == MODE_JSON ? "null" : "None");
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        cn_strbuf_putc(b, obj ? '{' : '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) cn_strbuf_puts(b, ", ");
            if (obj) {
                if (mode == MODE_JSON) json_string(b, c->string ? c->string : "");
                else repr_string(b, c->string ? c->string : "");
                cn_strbuf_puts(b, ": ");
            }
            print_value(b, c, mode);
        }
        cn_strbuf_putc(b, obj ? '}' : ']');
    }
}

void cn_py_str(cn_strbuf *b, const cJSON *v) {
    if (cJSON_IsString(v)) cn_strbuf_puts(b, v->valuestring);
    else print_value(b, v, MODE_REPR);
}

void cn_py_repr(cn_strbuf *b, const cJSON *v) { print_value(b, v, MODE_REPR); }

void cn_py_dumps(cn_strbuf *b, const cJSON *v) { print_value(b, v, MODE_JSON); }
