/* synth_tok.c - the synthetic byte-level BPE tokenizer.json; see cn_synth_tokenizer_json.
 *
 * Layout of the ids (always exactly vocab_size of them):
 *   0..19      Nemotron's special tokens (<unk>, <s>, </s>, <|im_start|> 10, <|im_end|> 11,
 *              <think> 12, </think> 13, <tool_call> 14, </tool_call> 15, else <SPECIAL_ID>),
 *              all listed in added_tokens with special true;
 *   20..275    the 256 byte tokens in byte order, spelled in GPT-2's bytes-to-unicode alphabet;
 *   276..      one token per BPE merge learned from kTrainText, in merge order;
 *   the rest   `<|reserved_ID|>` added tokens (special), so the table is full.
 * Training is classic BPE over GPT-2 pre-tokens (words never merge across a pre-token boundary):
 * repeatedly merge the most frequent adjacent pair, ties to the smallest (left id, right id), until
 * the vocab is full or no pair occurs twice. Deterministic, no global state, never exits.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/synth.h"

#define N_SPECIAL 20
#define N_BYTE 256
#define FIRST_MERGE (N_SPECIAL + N_BYTE)

/* English prose and C code, a few KB, written for this file: enough for ~1-2k merges. */
static const char kTrainText[] =
    "The quick brown fox jumps over the lazy dog. A language model reads text as a sequence of\n"
    "tokens, and the tokenizer decides where one token ends and the next begins. Byte pair\n"
    "encoding starts from single bytes and repeatedly joins the pair that appears most often,\n"
    "so common words become one token while rare words are spelled from smaller pieces.\n"
    "\n"
    "When the model answers a question, it first thinks about the problem, then writes the\n"
    "answer. The engine keeps the state of every layer in memory: the attention layers keep\n"
    "their keys and values, and the state space layers keep a small recurrent state that is\n"
    "updated once per token. Because the recurrent state has a fixed size, long prompts cost\n"
    "much less memory than they would in a model made only of attention layers.\n"
    "\n"
    "Mixture of experts layers route each token to a few experts out of many. The router\n"
    "computes a score for every expert, picks the top ones, and adds their outputs, weighted\n"
    "by the normalized scores. Only the chosen experts are computed, which is why a model with\n"
    "thirty billion parameters can run about three billion of them for each token.\n"
    "\n"
    "User: What is the capital of France?\n"
    "Assistant: The capital of France is Paris. It is also the largest city in the country.\n"
    "User: Can you write a function that adds two numbers?\n"
    "Assistant: Here is a small function in C that returns the sum of its two arguments.\n"
    "\n"
    "int add(int a, int b) {\n"
    "    return a + b;\n"
    "}\n"
    "\n"
    "static float dot(const float *x, const float *y, int n) {\n"
    "    float sum = 0.0f;\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        sum += x[i] * y[i];\n"
    "    }\n"
    "    return sum;\n"
    "}\n"
    "\n"
    "static void rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {\n"
    "    float ss = 0.0f;\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        ss += x[i] * x[i];\n"
    "    }\n"
    "    ss = 1.0f / sqrtf(ss / (float)n + eps);\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        out[i] = weight[i] * (ss * x[i]);\n"
    "    }\n"
    "}\n"
    "\n"
    "def softmax(values):\n"
    "    largest = max(values)\n"
    "    exps = [math.exp(v - largest) for v in values]\n"
    "    total = sum(exps)\n"
    "    return [e / total for e in exps]\n"
    "\n"
    "for token in tokens:\n"
    "    if token == end_of_text:\n"
    "        break\n"
    "    print(tokenizer.decode([token]), end=\"\")\n"
    "\n"
    "The weather today is sunny with a light wind from the west. Tomorrow there will be more\n"
    "clouds, and the temperature will drop a few degrees in the evening. It's a good day to\n"
    "walk in the park, read a book, or write some code that you have been meaning to finish.\n"
    "We'll meet at the station at nine o'clock, and then we're going to the museum together.\n"
    "They've said the new exhibition is about the history of computing, from the first\n"
    "mechanical calculators to the machines that train large models on thousands of chips.\n"
    "\n"
    "Numbers appear everywhere in text: 1, 2, 3, 10, 42, 100, 256, 1024, 2025, 3.14159,\n"
    "0.001, 65536 and 4096. Dates such as 2024-05-17 and times such as 12:30 are common too.\n"
    "\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>\n"
    "\n"
    "A careful engineer checks every return value, frees every allocation exactly once, and\n"
    "writes a test for each bug before fixing it. The test fails first, then the fix makes it\n"
    "pass, and the test stays in the suite so the bug can never come back unnoticed. Errors\n"
    "are reported with a message that names the file and the field that was wrong, because a\n"
    "message that only says that something failed leaves the user guessing what to change.\n"
    "\n"
    "if (rc != 0) {\n"
    "    fprintf(stderr, \"error: %s: %s\\n\", path, strerror(errno));\n"
    "    goto cleanup;\n"
    "}\n"
    "\n"
    "The model was trained on a mixture of web pages, books, scientific papers and source\n"
    "code in many programming languages. It can summarize documents, translate between\n"
    "languages, answer questions about a passage, and call tools when it needs information\n"
    "that it does not have. When it is not sure, it should say so instead of guessing.\n";

/* ---- GPT-2 pre-tokenization (ASCII form of its regex; bytes >= 0x80 count as letters) ------- */

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
static int is_letter(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int cls(unsigned char c) { return is_space(c) ? 0 : is_letter(c) ? 1 : is_digit(c) ? 2 : 3; }

/* Length of the pre-token starting at s[i] (n = strlen(s)), following
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t pretoken_len(const unsigned char *s, size_t i, size_t n) {
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    size_t j = i;
    if (s[j] == ' ' && j + 1 < n && !is_space(s[j + 1])) j++;
    if (!is_space(s[j])) {
        int c = cls(s[j]);
        while (j < n && cls(s[j]) == c) j++;
        return j - i;
    }
    while (j < n && is_space(s[j])) j++;
    /* \s+(?!\S): a run followed by a non-space gives back its last character. */
    if (j < n && j - i > 1) j--;
    return j - i;
}

/* ---- byte-level alphabet -------------------------------------------------------------------- */

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to 256+k. */
static void byte_alphabet(unsigned cp[256]) {
    unsigned extra = 0;
    for (unsigned b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        cp[b] = keep ? b : 256 + extra++;
    }
}

static size_t utf8_put(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6)); /* the alphabet stays below U+0800 */
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* ---- training ------------------------------------------------------------------------------- */

typedef struct word {
    int *ids; /* current token ids */
    int len;
    int count; /* occurrences in the text */
} word;

typedef struct trainer {
    char **str;   /* [vocab] token spellings (UTF-8), owned; NULL for specials/reserved */
    int n_tok;    /* ids in use: FIRST_MERGE + new tokens */
    int *merge_a, *merge_b, n_merge; /* [max merges] */
    word *w;
    int n_word;
    uint64_t *pkey; /* pair-count table, open addressing */
    int *pcnt;
    size_t psize;   /* power of two */
} trainer;

static int pre_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Splits the text into pre-tokens and groups equal ones (sorted, so order is deterministic). */
static int collect_words(trainer *t) {
    const unsigned char *s = (const unsigned char *)kTrainText;
    size_t n = sizeof kTrainText - 1, cap = 0, np = 0;
    char **pre = NULL;
    int rc = CN_ENOMEM;
    for (size_t i = 0; i < n;) {
        size_t len = pretoken_len(s, i, n);
        if (np == cap) {
            cap = cap ? cap * 2 : 1024;
            char **p = realloc(pre, cap * sizeof *p);
            if (!p) goto done;
            pre = p;
        }
        if (!(pre[np] = malloc(len + 1))) goto done;
        memcpy(pre[np], s + i, len);
        pre[np++][len] = '\0';
        i += len;
    }
    qsort(pre, np, sizeof *pre, pre_cmp);
    if (!(t->w = calloc(np ? np : 1, sizeof *t->w))) goto done;
    for (size_t k = 0; k < np; k++) {
        if (t->n_word && !strcmp(pre[k], pre[k - 1])) {
            t->w[t->n_word - 1].count++;
            continue;
        }
        word *w = &t->w[t->n_word++];
        w->len = (int)strlen(pre[k]);
        w->count = 1;
        if (!(w->ids = malloc((size_t)w->len * sizeof *w->ids))) goto done;
        for (int c = 0; c < w->len; c++) w->ids[c] = N_SPECIAL + (unsigned char)pre[k][c];
    }
    rc = CN_OK;
done:
    for (size_t k = 0; k < np; k++) free(pre[k]);
    free(pre);
    return rc;
}

static size_t pair_slot(const trainer *t, uint64_t key) {
    uint64_t h = key * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 20) & (t->psize - 1);
    while (t->pcnt[i] && t->pkey[i] != key) i = (i + 1) & (t->psize - 1);
    return i;
}

/* The most frequent adjacent pair (ties: smallest key, i.e. left id then right id); 0 if none. */
static int best_pair(trainer *t, int *a, int *b) {
    memset(t->pcnt, 0, t->psize * sizeof *t->pcnt);
    int best = 0;
    uint64_t bkey = 0;
    for (int k = 0; k < t->n_word; k++) {
        const word *w = &t->w[k];
        for (int c = 0; c + 1 < w->len; c++) {
            uint64_t key = (uint64_t)(uint32_t)w->ids[c] << 32 | (uint32_t)w->ids[c + 1];
            size_t s = pair_slot(t, key);
            t->pkey[s] = key;
            t->pcnt[s] += w->count;
            if (t->pcnt[s] > best || (t->pcnt[s] == best && key < bkey)) {
                best = t->pcnt[s];
                bkey = key;
            }
        }
    }
    *a = (int)(bkey >> 32);
    *b = (int)(bkey & 0xffffffffu);
    return best;
}

static int find_token(const trainer *t, const char *s) {
    for (int i = N_SPECIAL; i < t->n_tok; i++)
        if (!strcmp(t->str[i], s)) return i;
    return -1;
}

static int train(trainer *t, int vocab) {
    size_t pairs = 0;
    for (int k = 0; k < t->n_word; k++) pairs += (size_t)t->w[k].len;
    for (t->psize = 1024; t->psize < 2 * pairs; t->psize *= 2) {}
    t->pkey = malloc(t->psize * sizeof *t->pkey);
    t->pcnt = malloc(t->psize * sizeof *t->pcnt);
    if (!t->pkey || !t->pcnt) return CN_ENOMEM;
    /* Reused ids (see below) add merges without tokens: merge_a/b hold at most vocab entries. */
    while (t->n_tok < vocab && t->n_merge < vocab) {
        int a, b;
        if (best_pair(t, &a, &b) < 2) break;
        size_t la = strlen(t->str[a]), lb = strlen(t->str[b]);
        char *s = malloc(la + lb + 1);
        if (!s) return CN_ENOMEM;
        memcpy(s, t->str[a], la);
        memcpy(s + la, t->str[b], lb + 1);
        /* Two merges can spell the same string ("ab"+"c", "a"+"bc"): reuse the id. */
        int id = find_token(t, s);
        if (id < 0) {
            id = t->n_tok++;
            t->str[id] = s;
        } else {
            free(s);
        }
        t->merge_a[t->n_merge] = a;
        t->merge_b[t->n_merge++] = b;
        for (int k = 0; k < t->n_word; k++) {
            word *w = &t->w[k];
            int o = 0;
            for (int c = 0; c < w->len; c++) {
                if (c + 1 < w->len && w->ids[c] == a && w->ids[c + 1] == b) {
                    w->ids[o++] = id;
                    c++;
                } else {
                    w->ids[o++] = w->ids[c];
                }
            }
            w->len = o;
        }
    }
    return CN_OK;
}

/* ---- JSON ----------------------------------------------------------------------------------- */

static const char *special_name(int id, char *buf, size_t n) {
    static const char *const named[N_SPECIAL] = {
        [0] = "<unk>",        [1] = "<s>",          [2] = "</s>",
        [10] = "<|im_start|>", [11] = "<|im_end|>",  [12] = "<think>",
        [13] = "</think>",    [14] = "<tool_call>", [15] = "</tool_call>",
    };
    if (named[id]) return named[id];
    snprintf(buf, n, "<SPECIAL_%d>", id);
    return buf;
}

static cJSON *added_token(int id, const char *content) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "id", id);
    cJSON_AddStringToObject(o, "content", content);
    cJSON_AddBoolToObject(o, "single_word", 0);
    cJSON_AddBoolToObject(o, "lstrip", 0);
    cJSON_AddBoolToObject(o, "rstrip", 0);
    cJSON_AddBoolToObject(o, "normalized", 0);
    cJSON_AddBoolToObject(o, "special", 1);
    return o;
}

static cJSON *byte_level(int add_prefix_space, int trim_offsets) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", 1);
    return o;
}

/* cJSON reports allocation failure only through NULL returns; check the whole tree at the end by
 * counting what should be there instead of testing every call. */
static cJSON *build_json(const trainer *t, int vocab) {
    cJSON *root = cJSON_CreateObject(), *added = cJSON_CreateArray(), *model = cJSON_CreateObject(),
          *vmap = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    if (!root || !added || !model || !vmap || !merges) goto oom;
    char buf[64];
    int n_added = 0, n_vocab = 0, n_merges = 0;
    for (int id = 0; id < vocab; id++) {
        const char *s = t->str[id];
        if (id < N_SPECIAL) s = special_name(id, buf, sizeof buf);
        else if (id >= t->n_tok) {
            snprintf(buf, sizeof buf, "<|reserved_%d|>", id);
            s = buf;
        }
        if (id < N_SPECIAL || id >= t->n_tok) n_added += cJSON_AddItemToArray(added, added_token(id, s));
        n_vocab += cJSON_AddItemToObject(vmap, s, cJSON_CreateNumber(id));
    }
    for (int m = 0; m < t->n_merge; m++) {
        size_t la = strlen(t->str[t->merge_a[m]]), lb = strlen(t->str[t->merge_b[m]]);
        char *s = malloc(la + lb + 2);
        if (!s) goto oom;
        memcpy(s, t->str[t->merge_a[m]], la);
        s[la] = ' ';
        memcpy(s + la + 1, t->str[t->merge_b[m]], lb + 1);
        n_merges += cJSON_AddItemToArray(merges, cJSON_CreateString(s));
        free(s);
    }
    int ok = n_added == N_SPECIAL + (vocab - t->n_tok) && n_vocab == vocab && n_merges == t->n_merge;
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added);
    added = NULL;
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddItemToObject(root, "pre_tokenizer", byte_level(0, 1));
    /* No BOS is added: the chat template never emits <s> (architecture notes, section 5). */
    cJSON_AddItemToObject(root, "post_processor", byte_level(1, 0));
    cJSON_AddItemToObject(root, "decoder", byte_level(1, 1));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON_AddItemToObject(model, "vocab", vmap);
    vmap = NULL;
    cJSON_AddItemToObject(model, "merges", merges);
    merges = NULL;
    ok &= cJSON_GetArraySize(model) == 10;
    ok &= cJSON_AddItemToObject(root, "model", model);
    model = NULL;
    ok &= cJSON_GetArraySize(root) == 9;
    if (!ok) goto oom;
    return root;
oom:
    cJSON_Delete(root);
    cJSON_Delete(added);
    cJSON_Delete(model);
    cJSON_Delete(vmap);
    cJSON_Delete(merges);
    return NULL;
}

int cn_synth_tokenizer_json(int vocab_size, char **out, cn_err *err) {
    if (vocab_size < FIRST_MERGE)
        return cn_err_set(err, CN_EINVAL, "tokenizer: vocab_size %d is below %d (specials + bytes)",
                          vocab_size, FIRST_MERGE);
    trainer t = {0};
    cJSON *root = NULL;
    int rc = CN_ENOMEM;
    t.str = calloc((size_t)vocab_size, sizeof *t.str);
    t.merge_a = malloc((size_t)vocab_size * sizeof *t.merge_a);
    t.merge_b = malloc((size_t)vocab_size * sizeof *t.merge_b);
    if (!t.str || !t.merge_a || !t.merge_b) goto done;
    unsigned cp[256];
    byte_alphabet(cp);
    for (int b = 0; b < N_BYTE; b++) {
        char *s = malloc(3);
        if (!s) goto done;
        s[utf8_put(s, cp[b])] = '\0';
        t.str[N_SPECIAL + b] = s;
    }
    t.n_tok = FIRST_MERGE;
    if (collect_words(&t) != CN_OK || train(&t, vocab_size) != CN_OK) goto done;
    if (!(root = build_json(&t, vocab_size))) goto done;
    if (!(*out = cJSON_Print(root))) goto done;
    rc = CN_OK;
done:
    if (rc != CN_OK) cn_err_set(err, rc, "tokenizer: out of memory");
    cJSON_Delete(root);
    for (int i = 0; t.str && i < vocab_size; i++) free(t.str[i]);
    for (int k = 0; k < t.n_word; k++) free(t.w[k].ids);
    free(t.w);
    free(t.str);
    free(t.merge_a);
    free(t.merge_b);
    free(t.pkey);
    free(t.pcnt);
    return rc;
}
