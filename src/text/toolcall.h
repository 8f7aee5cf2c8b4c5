/* toolcall.h - one Qwen3-coder XML tool call: its grammar and its arguments typed by JSON schema.
 *
 * The streaming parser (parser.h) finds `<tool_call>` … `</tool_call>` and hands the body here.
 * This module only reads: it never looks at text outside one body and never keeps state.
 *
 * Body grammar (ws = ASCII whitespace, allowed between the pieces and at both ends):
 *     <function=NAME> ( <parameter=KEY>VALUE</parameter> )* </function>
 * NAME and KEY are non-empty and hold no '<', '>' or newline. A VALUE ends at the first
 * `</parameter>` followed, after whitespace, by `<parameter=` or `</function>`; one leading and one
 * trailing '\n' are stripped. A repeated KEY keeps the last value.
 *
 * Typing a VALUE (the property schema is tools[i].function.parameters.properties[KEY]):
 *   - the types are the schema's "type" (a name or a list), else those of each "anyOf"/"oneOf"
 *     branch in order, else those of its "enum" values; aliases fold in (str, text → string;
 *     int*, uint*, long → integer; num*, float, double → number; bool → boolean; dict* → object;
 *     list*, arr → array);
 *   - the non-string types are tried in the listed order, string is the fallback:
 *       integer  optional sign and digits (surrounding whitespace allowed) → number; beyond 2^53
 *                the digits are kept exactly (a raw JSON number);
 *       number   a finite decimal/exponent number (no hex, inf, nan) → number;
 *       boolean  "true"/"false", any case → true/false;
 *       null     "null"/"none", any case → null (also accepted for any non-string type, as vLLM
 *                does: a model writes null for "no value");
 *       object / array: JSON of that kind, else the same after Python-literal repair ('single
 *                quotes', True/False/None, a trailing comma) → the value;
 *       a type name not listed above: valid JSON → that value;
 *   - no schema (unknown tool, unknown key, a property with no type, anyOf, oneOf or enum): valid
 *     JSON → that value, else the string.
 */
#ifndef CN_TEXT_TOOLCALL_H
#define CN_TEXT_TOOLCALL_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* The function object ({"name", "parameters", ...}) of the tool called name, or NULL. tools is an
 * OpenAI tools array (elements with a "function" member, or bare functions) or NULL. */
const cJSON *cn_toolcall_find(const cJSON *tools, const char *name);

/* Types v[0, n) by schema prop (NULL: no schema). Returns a new item (caller owns; cJSON_Delete)
 * or NULL when out of memory. */
cJSON *cn_toolcall_type_value(const char *v, size_t n, const cJSON *prop);

/* Parses the body between `<tool_call>` and `</tool_call>`. Returns 1 with *name (malloc'd) and
 * *args (a cJSON object) for the caller to free, 0 if the body is malformed, CN_ENOMEM; on 0 or
 * an error the outputs are untouched. */
int cn_toolcall_parse(const char *body, size_t n, const cJSON *tools,
                      char **name,   /* OUT: function name */
                      cJSON **args); /* OUT: typed arguments */

#endif
