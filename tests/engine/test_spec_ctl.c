/* test_spec_ctl.c - the depth controller of speculative decoding (engine/speculate.h), fed
 * synthetic costs in milliseconds (nothing here is timed, so the outcome never depends on the
 * machine's speed or load).
 *
 * What it must do: speculate while a round pays for itself, park when it does not (a costly round
 * or drafts that are rejected), ignore a lone preempted step (a round or a plain step that took a
 * scheduler quantum), charge the flush of slots that plain steps queued to the plain steps, and
 * resume from a park when a probe shows speculation pays again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/speculate.h"

static cn_spec_ctl ctl_new(int max_depth) {
    cn_spec_ctl c = {.max_depth = max_depth, .backoff = 4};
    for (int j = 0; j < CN_SPEC_MAX_DEPTH; j++) c.acc[j] = 0.6;
    return c;
}

/* Runs steps as the engine does: pick a depth, then report a plain step of plain_ms or a round of
 * round_ms(depth) with the drafts accepted as acc_of(depth). Returns the rounds taken. */
typedef struct sim {
    double plain_ms;
    double base_ms, per_draft_ms; /* a round costs base + per_draft * depth */
    int accept;                   /* drafts kept per round, at most the depth */
    double spike_ms;              /* added to step number spike_at (-1: none) */
    int spike_at;
} sim;

static int run(cn_spec_ctl *c, const sim *s, int steps) {
    int rounds = 0;
    for (int i = 0; i < steps; i++) {
        int d = cn_spec_ctl_pick(c, 100);
        double extra = i == s->spike_at ? s->spike_ms : 0;
        if (d == 0) {
            cn_spec_ctl_plain(c, s->plain_ms + extra);
            continue;
        }
        rounds++;
        int acc = s->accept < d ? s->accept : d;
        cn_spec_ctl_round(c, d, acc, s->base_ms + s->per_draft_ms * d + extra);
    }
    return rounds;
}

/* A round of depth 1 that costs 1.3 plain steps and keeps its draft pays: it keeps speculating. */
static void test_speculates_when_it_pays(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(4);
    sim s = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 0.3, .accept = 1, .spike_at = -1};
    int rounds = run(&c, &s, 200);
    assert_true(rounds > 190);
    assert_false(c.parked);
    assert_true(c.extra_ms > 0.29 && c.extra_ms < 0.31);
}

/* The same, with one round preempted for 8 ms: an EWMA of costs would have parked here. */
static void test_one_preempted_round_does_not_park(void **state) {
    (void)state;
    for (int at = 5; at < 40; at += 7) {
        cn_spec_ctl c = ctl_new(4);
        sim s = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 0.3, .accept = 1,
                 .spike_ms = 8.0, .spike_at = at};
        int rounds = run(&c, &s, 100);
        assert_true(rounds > 95);
        assert_false(c.parked);
    }
}

/* A preempted plain step (the baseline itself) does not make rounds look cheap either way. */
static void test_one_preempted_plain_step(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(4);
    sim s = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 0.3, .accept = 1, .spike_ms = 8.0,
             .spike_at = 0}; /* the very first step is the plain one */
    run(&c, &s, 100);
    assert_true(c.plain_ms > 0.99 && c.plain_ms < 1.01);
    assert_false(c.parked);
}

/* Rounds that cost more than they commit park speculation, and it stays mostly parked. */
static void test_parks_when_rounds_cost_too_much(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(4);
    sim s = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 1.5, .accept = 1, .spike_at = -1};
    int rounds = run(&c, &s, 400);
    assert_true(c.parked);
    assert_true(rounds < 40);
}

/* Drafts that are never kept park speculation however cheap a round is. */
static void test_parks_when_drafts_are_rejected(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(4);
    sim s = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 0.1, .accept = 0, .spike_at = -1};
    int rounds = run(&c, &s, 400);
    assert_true(c.parked);
    assert_true(rounds < 40);
}

/* Parked by a costly period, it resumes once a probe shows rounds pay again. */
static void test_probe_resumes(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(4);
    sim bad = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 3.0, .accept = 1, .spike_at = -1};
    run(&c, &bad, 100);
    assert_true(c.parked);
    sim good = {.plain_ms = 1.0, .base_ms = 1.0, .per_draft_ms = 0.3, .accept = 1, .spike_at = -1};
    int rounds = run(&c, &good, 600);
    assert_false(c.parked);
    assert_true(rounds > 300);
}

/* A round that flushed slots queued by plain steps (the catch-up): that share of its time is the
 * plain steps' (the head's cost per slot), not the round's. */
static void test_catchup_is_charged_to_plain_steps(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(1);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cn_spec_ctl_pick(&c, 100), 0); /* three plain steps first */
        cn_spec_ctl_plain(&c, 1.0);
    }
    assert_int_equal(cn_spec_ctl_pick(&c, 100), 1);
    c.catchup_ms = 5.0; /* as cn_spec_round records it: 20 slots at 0.25 ms */
    c.catchup_n = 20;
    cn_spec_ctl_round(&c, 1, 1, 6.3);
    assert_true(c.extra_ms > 0.29 && c.extra_ms < 0.31);
    assert_true(c.head_ms > 0.249 && c.head_ms < 0.251);
    assert_int_equal(c.catchup_n, 0); /* consumed */
    assert_int_equal(cn_spec_ctl_pick(&c, 100), 1);
    assert_false(c.parked);
}

/* Fixed depth (tests, benchmarks) always drafts the most that fits. */
static void test_fixed_depth(void **state) {
    (void)state;
    cn_spec_ctl c = ctl_new(3);
    c.fixed = 1;
    assert_int_equal(cn_spec_ctl_pick(&c, 100), 3);
    assert_int_equal(cn_spec_ctl_pick(&c, 2), 2);
    assert_int_equal(cn_spec_ctl_pick(&c, 0), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_speculates_when_it_pays),
        cmocka_unit_test(test_one_preempted_round_does_not_park),
        cmocka_unit_test(test_one_preempted_plain_step),
        cmocka_unit_test(test_parks_when_rounds_cost_too_much),
        cmocka_unit_test(test_parks_when_drafts_are_rejected),
        cmocka_unit_test(test_probe_resumes),
        cmocka_unit_test(test_catchup_is_charged_to_plain_steps),
        cmocka_unit_test(test_fixed_depth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
