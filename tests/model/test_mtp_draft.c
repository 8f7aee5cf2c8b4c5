/* test_mtp_draft.c - the MTP head's drafting copy (model.h cn_model_mtp_draft_build).
 *
 * The copy drafts close to the stored head (logits rows of cosine above DRAFT_COS with the
 * stored head's on most rows; on the trained default model the same greedy draft at nearly every
 * position) but is really used (not the same bits); the stored head gives
 * the same bits before and after it is built; a drafting state falls back to the stored head
 * while there is no copy; bad arguments are refused. Runs on $CAIRN_BACKEND: a backend with
 * device memory keeps the stored head (CN_EUNSUPPORTED) and drafts with it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model.h"
#include "model/state.h"
#include "test_util.h"

#define N_POS 24
/* NVFP4 weights (4-bit values) and int8 activations on a head of random weights: 0.965-0.987 on
 * this one's rows, but for one whose router picks another expert (0.65), hence most rows, not all;
 * its greedy picks agree on 17 of 24 (random logits lie close together). A trained head agrees far
 * more: test_trained_head. */
#define DRAFT_COS 0.95
#define TRAINED_AGREE 0.9 /* share of positions where a trained head's two drafts pick alike */

typedef struct fixture {
    cn_backend *b;
    cn_model *m;
    int V, H;
    int32_t tokens[N_POS + 1];
    float *hidden; /* [N_POS][H] the target's hiddens over tokens */
} fixture;

static void open_fixture(fixture *f, const char *name) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_data_dir(), name);
    f->b = tu_backend(2);
    assert_non_null(f->b);
    cn_err err;
    cn_err_clear(&err);
    cn_model_opts o = {.ubatch = 64};
    assert_int_equal(cn_model_open(&f->m, dir, f->b, &o, &err), 0);
    f->V = cn_model_config(f->m)->vocab_size;
    f->H = cn_model_config(f->m)->hidden_size;
    uint64_t rng = 7;
    for (int i = 0; i <= N_POS; i++) f->tokens[i] = tu_rnd_token(&rng, f->V);
    f->hidden = NULL;
    if (!cn_model_has_mtp(f->m)) return;
    cn_state *s;
    assert_int_equal(cn_state_create(&s, f->m, N_POS, 0), 0);
    f->hidden = malloc((size_t)N_POS * f->H * sizeof *f->hidden);
    cn_batch bt = {.tokens = f->tokens, .n = N_POS, .all_hidden = 1, .hidden = f->hidden};
    assert_int_equal(cn_model_forward(f->m, s, &bt), 0);
    cn_state_free(s);
}

static void close_fixture(fixture *f) {
    free(f->hidden);
    cn_model_close(f->m);
    cn_backend_free(f->b);
}

/* Draft logits [N_POS][V] of a fresh head state of kind mtp (1 or 2) over the fixture's inputs. */
static float *head_logits(fixture *f, int mtp) {
    cn_state *s;
    assert_int_equal(cn_state_create(&s, f->m, N_POS, mtp), 0);
    float *lg = malloc((size_t)N_POS * f->V * sizeof *lg);
    assert_non_null(lg);
    assert_int_equal(cn_model_mtp_forward(f->m, s, f->hidden, f->tokens + 1, N_POS, lg, NULL), 0);
    cn_state_free(s);
    return lg;
}

static double cosine(const float *a, const float *b, int n) {
    double aa = 0, bb = 0, ab = 0;
    for (int i = 0; i < n; i++) {
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
        ab += (double)a[i] * b[i];
    }
    return aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0;
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* The stored head before and after the build; the drafting state on either side of it. */
static void test_draft_copy(void **st) {
    (void)st;
    fixture f;
    open_fixture(&f, "nh-mtp-bf16");
    assert_true(cn_model_has_mtp(f.m));
    const size_t n = (size_t)N_POS * f.V;
    float *stored = head_logits(&f, 1);
    float *before = head_logits(&f, 2);
    assert_memory_equal(before, stored, n * sizeof *before); /* no copy yet: the stored head */

    int rc = cn_model_mtp_draft_build(f.m);
    if (rc == CN_EUNSUPPORTED) { /* a device backend keeps the stored head for drafts */
        float *d = head_logits(&f, 2);
        assert_memory_equal(d, stored, n * sizeof *d);
        free(d);
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(cn_model_mtp_draft_build(f.m), 0); /* once: a second call keeps it */
        float *again = head_logits(&f, 1);
        assert_memory_equal(again, stored, n * sizeof *again); /* the stored head is untouched */
        float *draft = head_logits(&f, 2);
        double e = tu_rel_err(draft, stored, n);
        int same = 0, close = 0;
        for (int i = 0; i < N_POS; i++) {
            const float *d = draft + (size_t)i * f.V, *r = stored + (size_t)i * f.V;
            same += argmax(d, f.V) == argmax(r, f.V);
            close += cosine(d, r, f.V) > DRAFT_COS;
        }
        fprintf(stderr, "draft copy: logits rel err %.3g; rows of cosine > %.2f %d/%d, "
                        "greedy picks agree %d/%d\n",
                e, DRAFT_COS, close, N_POS, same, N_POS);
        assert_true(e > 0); /* the copy drafts, not the stored head */
        assert_true(close >= N_POS * 3 / 4);
        assert_true(same >= N_POS / 2);
        free(again);
        free(draft);
    }
    free(stored);
    free(before);
    close_fixture(&f);
}

/* The default model's head (models/cobble, trained) over the target's own greedy text: the copy
 * drafts the stored head's token at nearly every position. */
static void test_trained_head(void **st) {
    (void)st;
    enum { N = 96 };
    char dir[600];
    snprintf(dir, sizeof dir, "%s/../../models/cobble", tu_data_dir());
    cn_backend *b = tu_backend(2);
    assert_non_null(b);
    cn_model *m;
    cn_err err;
    cn_err_clear(&err);
    cn_model_opts o = {.ubatch = 128};
    assert_int_equal(cn_model_open(&m, dir, b, &o, &err), 0);
    const int V = cn_model_config(m)->vocab_size, H = cn_model_config(m)->hidden_size;
    int32_t toks[N + 1];
    toks[0] = 1; /* bos, then the target's greedy continuation */
    cn_state *s;
    assert_int_equal(cn_state_create(&s, m, N + 1, 0), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(cn_model_decode_greedy(m, s, toks[i], &toks[i + 1]), 0);
    cn_state_free(s);
    assert_int_equal(cn_state_create(&s, m, N, 0), 0);
    float *hid = malloc((size_t)N * H * sizeof *hid);
    cn_batch bt = {.tokens = toks, .n = N, .all_hidden = 1, .hidden = hid};
    assert_int_equal(cn_model_forward(m, s, &bt), 0);
    cn_state_free(s);
    int rc = cn_model_mtp_draft_build(m);
    if (rc != CN_EUNSUPPORTED) {
        assert_int_equal(rc, 0);
        float *lg[2];
        for (int k = 0; k < 2; k++) { /* the stored head, then the copy */
            cn_state *ms;
            assert_int_equal(cn_state_create(&ms, m, N, 1 + k), 0);
            lg[k] = malloc((size_t)N * V * sizeof *lg[k]);
            assert_int_equal(cn_model_mtp_forward(m, ms, hid, toks + 1, N, lg[k], NULL), 0);
            cn_state_free(ms);
        }
        int same = 0;
        for (int i = 0; i < N; i++)
            same += argmax(lg[0] + (size_t)i * V, V) == argmax(lg[1] + (size_t)i * V, V);
        fprintf(stderr, "trained head: drafts agree at %d of %d positions\n", same, N);
        assert_true(same >= TRAINED_AGREE * N);
        assert_true(tu_rel_err(lg[1], lg[0], (size_t)N * V) > 0);
        free(lg[0]);
        free(lg[1]);
    }
    free(hid);
    cn_model_close(m);
    cn_backend_free(b);
}

static void test_bad_args(void **st) {
    (void)st;
    fixture f;
    open_fixture(&f, "nh-mix-f32"); /* no MTP head */
    assert_false(cn_model_has_mtp(f.m));
    assert_int_equal(cn_model_mtp_draft_build(f.m), CN_EINVAL);
    cn_state *s = NULL;
    assert_int_equal(cn_state_create(&s, f.m, 8, 2), CN_EINVAL);
    assert_int_equal(cn_state_create(&s, f.m, 8, 3), CN_EINVAL);
    assert_int_equal(cn_state_create(&s, f.m, 8, -1), CN_EINVAL);
    assert_null(s);
    close_fixture(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_copy),
        cmocka_unit_test(test_trained_head),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
