/* toolcall.c - the grammar of one XML tool call body and schema typing of its values. */
#include "text/toolcall.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

static int starts(const char *s, size_t i, size_t n, const char *lit) {
    size_t l = strlen(lit);
    return n - i >= l && memcmp(s + i, lit, l) == 0;
}

/* First occurrence of lit in s[from, n), or n. */
static size_t find(const char *s, size_t from, size_t n, const char *lit) {
    size_t l = strlen(lit);
    for (size_t i = from; i + l <= n; i++)
        if (s[i] == lit[0] && memcmp(s + i, lit, l) == 0) return i;
    return n;
}

/* ---------- tools lookup ---------- */

const cJSON *cn_toolcall_find(const cJSON *tools, const char *name) {
    if (!cJSON_IsArray(tools)) return NULL;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(fn)) fn = t; /* a bare function, as the template also accepts */
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0) return fn;
    }
    return NULL;
}

/* ---------- types named by a schema ---------- */

enum vtype { VT_STRING, VT_INTEGER, VT_NUMBER, VT_BOOLEAN, VT_NULL, VT_OBJECT, VT_ARRAY, VT_ANY };

#define MAX_TYPES 16

static enum vtype type_named(const char *s) {
    char t[32];
    size_t i = 0;
    for (; s[i] && i < sizeof t - 1; i++) t[i] = (char)tolower((unsigned char)s[i]);
    t[i] = '\0';
    if (!strcmp(t, "string") || !strcmp(t, "str") || !strcmp(t, "text") || !strcmp(t, "enum"))
        return VT_STRING;
    if (!strncmp(t, "int", 3) || !strncmp(t, "uint", 4) || !strcmp(t, "long")) return VT_INTEGER;
    if (!strncmp(t, "num", 3) || !strcmp(t, "float") || !strcmp(t, "double")) return VT_NUMBER;
    if (!strcmp(t, "boolean") || !strcmp(t, "bool")) return VT_BOOLEAN;
    if (!strcmp(t, "null") || !strcmp(t, "none")) return VT_NULL;
    if (!strcmp(t, "object") || !strncmp(t, "dict", 4)) return VT_OBJECT;
    if (!strcmp(t, "array") || !strcmp(t, "arr") || !strncmp(t, "list", 4)) return VT_ARRAY;
    return VT_ANY;
}

static void add_type(enum vtype *ts, int *n, enum vtype t) {
    for (int i = 0; i < *n; i++)
        if (ts[i] == t) return;
    if (*n < MAX_TYPES) ts[(*n)++] = t;
}

/* Collects the types a property schema allows, in the order it lists them. */
static void collect_types(const cJSON *s, enum vtype *ts, int *n, int depth) {
    if (!cJSON_IsObject(s) || depth > 4) return; /* anyOf nests rarely; never loop on a cycle */
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) {
        add_type(ts, n, type_named(type->valuestring));
        return;
    }
    if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            if (cJSON_IsString(t)) add_type(ts, n, type_named(t->valuestring));
        }
        if (*n) return;
    }
    static const char *const unions[] = {"anyOf", "oneOf"};
    for (int u = 0; u < 2; u++) {
        const cJSON *br = cJSON_GetObjectItemCaseSensitive(s, unions[u]), *b;
        if (cJSON_IsArray(br)) cJSON_ArrayForEach(b, br) collect_types(b, ts, n, depth + 1);
    }
    if (*n) return;
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *e;
    if (cJSON_IsArray(en)) {
        cJSON_ArrayForEach(e, en) {
            enum vtype t = cJSON_IsString(e) ? VT_STRING
                         : cJSON_IsBool(e)   ? VT_BOOLEAN
                         : cJSON_IsNull(e)   ? VT_NULL
                         : cJSON_IsNumber(e) ? VT_NUMBER
                         : cJSON_IsArray(e)  ? VT_ARRAY
                                             : VT_OBJECT;
            add_type(ts, n, t);
        }
    }
}

/* ---------- scalar conversions; each returns NULL when the text is not of its type ---------- */

/* The value with surrounding whitespace cut off, for the scalar types (Python's int() and float()
 * accept it too). */
static void trim(const char **v, size_t *n) {
    while (*n && is_ws(**v)) (*v)++, (*n)--;
    while (*n && is_ws((*v)[*n - 1])) (*n)--;
}

static int ieq(const char *v, size_t n, const char *lit) {
    if (strlen(lit) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)v[i]) != lit[i]) return 0;
    return 1;
}

static cJSON *as_integer(const char *v, size_t n, int *oom) {
    trim(&v, &n);
    size_t i = 0;
    int neg = 0;
    if (i < n && (v[i] == '+' || v[i] == '-')) neg = v[i++] == '-';
    if (i == n) return NULL;
    for (size_t k = i; k < n; k++)
        if (v[k] < '0' || v[k] > '9') return NULL;
    while (i + 1 < n && v[i] == '0') i++; /* JSON forbids leading zeros; Python's int drops them */
    char digits[64];
    if (n - i < 16) { /* below 10^15 < 2^53: exact as a double */
        int64_t x = 0;
        for (size_t k = i; k < n; k++) x = x * 10 + (v[k] - '0');
        cJSON *r = cJSON_CreateNumber((double)(neg ? -x : x));
        if (!r) *oom = 1;
        return r;
    }
    /* Larger: keep every digit, as Python's int would; a double would round them. */
    char *raw = n - i + 2 <= sizeof digits ? digits : malloc(n - i + 2);
    if (!raw) {
        *oom = 1;
        return NULL;
    }
    size_t o = 0;
    if (neg && !(n - i == 1 && v[i] == '0')) raw[o++] = '-';
    memcpy(raw + o, v + i, n - i);
    raw[o + n - i] = '\0';
    cJSON *r = cJSON_CreateRaw(raw);
    if (raw != digits) free(raw);
    if (!r) *oom = 1;
    return r;
}

static cJSON *as_number(const char *v, size_t n, int *oom) {
    trim(&v, &n);
    if (n == 0 || n > 64) return NULL;
    char tmp[65];
    int digit = 0;
    for (size_t k = 0; k < n; k++) { /* rules out hex, inf, nan, which strtod would take */
        char c = v[k];
        if (c >= '0' && c <= '9') digit = 1;
        else if (c != '+' && c != '-' && c != '.' && c != 'e' && c != 'E') return NULL;
        tmp[k] = c;
    }
    tmp[n] = '\0';
    if (!digit) return NULL;
    char *end;
    errno = 0;
    double d = strtod(tmp, &end);
    if (end != tmp + n || !isfinite(d) || errno == ERANGE) return NULL;
    cJSON *r = cJSON_CreateNumber(d);
    if (!r) *oom = 1;
    return r;
}

static cJSON *as_boolean(const char *v, size_t n, int *oom) {
    trim(&v, &n);
    cJSON *r;
    if (ieq(v, n, "true")) r = cJSON_CreateTrue();
    else if (ieq(v, n, "false")) r = cJSON_CreateFalse();
    else return NULL;
    if (!r) *oom = 1;
    return r;
}

static int is_null_text(const char *v, size_t n) {
    trim(&v, &n);
    return ieq(v, n, "null") || ieq(v, n, "none");
}

/* v as one complete JSON value (any kind), or NULL. */
static cJSON *as_json(const char *v, size_t n) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(v, n, &end, 0);
    if (!j) return NULL;
    size_t used = (size_t)(end - v);
    if (skip_ws(v, used, n) != n) {
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

/* Rewrites a Python literal into JSON text: 'single' strings become "double" ones, True, False
 * and None become true, false and null, a comma before ] or } goes. Other text is copied, so
 * what is still not JSON fails to parse afterwards. Returns a malloc'd string or NULL (OOM). */
static char *python_to_json(const char *v, size_t n) {
    char *o = malloc(2 * n + 1); /* a quote escaped per byte at most doubles the length */
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        char c = v[i];
        if (c == '"') { /* copy a double-quoted string whole */
            o[k++] = v[i++];
            while (i < n && v[i] != '"') {
                if (v[i] == '\\' && i + 1 < n) o[k++] = v[i++];
                o[k++] = v[i++];
            }
            if (i < n) o[k++] = v[i++];
        } else if (c == '\'') {
            o[k++] = '"';
            i++;
            while (i < n && v[i] != '\'') {
                if (v[i] == '\\' && i + 1 < n && v[i + 1] == '\'') {
                    o[k++] = '\'';
                    i += 2;
                    continue;
                }
                if (v[i] == '\\' && i + 1 < n) o[k++] = v[i++];
                else if (v[i] == '"') o[k++] = '\\';
                o[k++] = v[i++];
            }
            o[k++] = '"';
            if (i < n) i++;
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)v[j]) || v[j] == '_')) j++;
            const char *rep = NULL;
            if (j - i == 4 && !memcmp(v + i, "True", 4)) rep = "true";
            else if (j - i == 5 && !memcmp(v + i, "False", 5)) rep = "false";
            else if (j - i == 4 && !memcmp(v + i, "None", 4)) rep = "null";
            if (rep) {
                memcpy(o + k, rep, strlen(rep));
                k += strlen(rep);
            } else {
                memcpy(o + k, v + i, j - i);
                k += j - i;
            }
            i = j;
        } else if (c == ',' && (skip_ws(v, i + 1, n) < n) &&
                   (v[skip_ws(v, i + 1, n)] == ']' || v[skip_ws(v, i + 1, n)] == '}')) {
            i++;
        } else {
            o[k++] = v[i++];
        }
    }
    o[k] = '\0';
    return o;
}

/* v as JSON of kind want (cJSON_Object or cJSON_Array), directly or after Python repair. */
static cJSON *as_container(const char *v, size_t n, int want, int *oom) {
    cJSON *j = as_json(v, n);
    if (j && (j->type & 0xFF) == want) return j;
    cJSON_Delete(j);
    char *fixed = python_to_json(v, n);
    if (!fixed) {
        *oom = 1;
        return NULL;
    }
    j = as_json(fixed, strlen(fixed));
    free(fixed);
    if (j && (j->type & 0xFF) == want) return j;
    cJSON_Delete(j);
    return NULL;
}

/* A cJSON string of v[0, n) (cJSON wants it NUL-terminated). */
static cJSON *as_string(const char *v, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, v, n);
    s[n] = '\0';
    cJSON *r = cJSON_CreateString(s);
    free(s);
    return r;
}

cJSON *cn_toolcall_type_value(const char *v, size_t n, const cJSON *prop) {
    enum vtype ts[MAX_TYPES];
    int nt = 0, oom = 0, has_string = 0;
    collect_types(prop, ts, &nt, 0);
    for (int i = 0; i < nt; i++)
        if (ts[i] == VT_STRING) has_string = 1;
    if (nt == 0) { /* no schema: JSON if it is JSON */
        cJSON *j = as_json(v, n);
        return j ? j : as_string(v, n);
    }
    for (int i = 0; i < nt; i++) {
        cJSON *r = NULL;
        switch (ts[i]) {
        case VT_INTEGER: r = as_integer(v, n, &oom); break;
        case VT_NUMBER: r = as_number(v, n, &oom); break;
        case VT_BOOLEAN: r = as_boolean(v, n, &oom); break;
        case VT_NULL:
            if (is_null_text(v, n) && !(r = cJSON_CreateNull())) oom = 1;
            break;
        case VT_OBJECT: r = as_container(v, n, cJSON_Object, &oom); break;
        case VT_ARRAY: r = as_container(v, n, cJSON_Array, &oom); break;
        case VT_ANY: r = as_json(v, n); break; /* a type we do not know: JSON if it is JSON */
        case VT_STRING: break;                 /* the fallback below */
        }
        if (r || oom) return r;
    }
    if (!has_string && is_null_text(v, n)) return cJSON_CreateNull();
    return as_string(v, n);
}

/* ---------- the body ---------- */

/* Reads NAME in `<prefix NAME>` starting at s[i] (just past the prefix); *end gets the index past
 * '>'. Returns 0 if the name is empty, unterminated or holds '<' or a newline. */
static int read_name(const char *s, size_t i, size_t n, size_t *nb, size_t *ne, size_t *end) {
    size_t j = i;
    while (j < n && s[j] != '>') {
        if (s[j] == '<' || s[j] == '\n') return 0;
        j++;
    }
    if (j == n || j == i) return 0;
    *nb = i;
    *ne = j;
    *end = j + 1;
    return 1;
}

static char *dup_range(const char *s, size_t a, size_t b) {
    char *r = malloc(b - a + 1);
    if (!r) return NULL;
    memcpy(r, s + a, b - a);
    r[b - a] = '\0';
    return r;
}

/* One step through the body from s[*j]: 1 with a parameter's key [kb, ke) and raw value [vb, ve)
 * (*j moves past its `</parameter>`), 2 at a closing `</function>` that only whitespace follows,
 * 0 if the body is malformed here. */
static int next_param(const char *s, size_t *j, size_t n, size_t *kb, size_t *ke, size_t *vb,
                      size_t *ve) {
    static const char FN_END[] = "</function>", PA[] = "<parameter=", PA_END[] = "</parameter>";
    size_t i = skip_ws(s, *j, n);
    if (starts(s, i, n, FN_END)) return skip_ws(s, i + strlen(FN_END), n) == n ? 2 : 0;
    if (!starts(s, i, n, PA) || !read_name(s, i + strlen(PA), n, kb, ke, vb)) return 0;
    for (size_t e = *vb;; e++) { /* the first </parameter> that a tag follows ends the value */
        e = find(s, e, n, PA_END);
        if (e == n) return 0;
        size_t after = skip_ws(s, e + strlen(PA_END), n);
        if (starts(s, after, n, PA) || starts(s, after, n, FN_END)) {
            *ve = e;
            *j = e + strlen(PA_END);
            return 1;
        }
    }
}

int cn_toolcall_parse(const char *s, size_t n, const cJSON *tools, char **name_out,
                      cJSON **args_out) {
    static const char FN[] = "<function=";
    size_t i = skip_ws(s, 0, n), nb = 0, ne = 0, kb = 0, ke = 0, vb = 0, ve = 0, j;
    int r;
    if (!starts(s, i, n, FN) || !read_name(s, i + strlen(FN), n, &nb, &ne, &i)) return 0;
    /* First pass: the structure. Nothing is allocated until the body is known to be well formed. */
    j = i;
    while ((r = next_param(s, &j, n, &kb, &ke, &vb, &ve)) == 1) {}
    if (r == 0) return 0;

    /* Second pass: build. */
    char *name = dup_range(s, nb, ne);
    cJSON *args = cJSON_CreateObject();
    if (!name || !args) goto oom;
    const cJSON *fn = cn_toolcall_find(tools, name);
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties");
    j = i;
    while (next_param(s, &j, n, &kb, &ke, &vb, &ve) == 1) {
        size_t a = vb, b = ve; /* the template writes "<parameter=K>\nV\n</parameter>" */
        if (a < b && s[a] == '\n') a++;
        if (a < b && s[b - 1] == '\n') b--;
        char *key = dup_range(s, kb, ke);
        if (!key) goto oom;
        const cJSON *prop = cJSON_GetObjectItemCaseSensitive(props, key);
        cJSON *val = cn_toolcall_type_value(s + a, b - a, prop);
        if (!val) {
            free(key);
            goto oom;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(args, key); /* a repeated key: the last wins */
        int ok = cJSON_AddItemToObject(args, key, val);
        free(key);
        if (!ok) {
            cJSON_Delete(val);
            goto oom;
        }
    }
    *name_out = name;
    *args_out = args;
    return 1;
oom:
    free(name);
    cJSON_Delete(args);
    return CN_ENOMEM;
}
