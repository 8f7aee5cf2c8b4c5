/* cpu_att_block_body.h - the body of the tiled prefill attention kernel, written once over a
 * vector of AB_VW fp32 lanes and included by cpu_att_block.c once per ISA (scalar: one lane);
 * no include guard. What it computes, and the numerics it keeps, are in cpu_att_block.c.
 *
 * The including file defines:
 *   AB_V, AB_VW          the vector type and its lanes (1, 8 or 16)
 *   AB_IN                static inline, always inlined, with the ISA's target attribute
 *   AB_SFX               the suffix of this ISA's names
 *   AB_LOAD(p), AB_STORE(p, v)  aligned vector load / store
 *   AB_SET1(x), AB_ZERO  broadcast, zero
 *   AB_FMA(a, b, c)      a * b + c (fused where the ISA fuses)
 *   AB_MAX(a, b), AB_SUB(a, b), AB_MUL(a, b), AB_ADD(a, b)
 *   AB_EXP(x)            e^x for x <= 0
 *   AB_ANY_GT(a, b)      nonzero when some lane of a is above b's
 *   AB_ROW(dt, row, Dh, scale, dst)  dst[d] = value d of the cache row * scale for d < Dh, then
 *                        zeros up to the next multiple of AB_VW
 *   AB_NVG               the most lane vectors of q the score micro-kernel holds
 *   AB_KB(NV)            keys it holds at once beside min(NV, AB_NVG) lane vectors
 *   AB_LB, AB_DB         lanes and column vectors the value micro-kernel holds
 *   AB_PREFETCH(p)       a hint to fetch the line at p (or nothing)
 *   AB_KBMAX             the largest AB_KB
 * and, before the first inclusion, ab_state, AB_VK, AB_KS and AB_PF.
 */

#define AB_CAT_(a, b) a##b
#define AB_CAT(a, b) AB_CAT_(a, b)
#define AB_NAME(x) AB_CAT(x, AB_SFX)

/* Scores of the step's AB_VK keys for every lane: s[i * LP + x] = sum over d (in order) of
 * qT[d][x] * k_i[d], one fused chain per score. KB keys at a time stay in registers against NG
 * lane vectors of q from g on; each key value is broadcast once for all of them. */
AB_IN void AB_NAME(ab_scores_kb)(ab_state *st, int64_t Dh, const int LP, const int g,
                                  const int NV, const int kb, const int KB) {
    {
        AB_V acc[AB_KBMAX][AB_NVG];
#pragma GCC unroll 16
        for (int i = 0; i < KB; i++)
#pragma GCC unroll 4
            for (int n = 0; n < NV; n++) acc[i][n] = AB_ZERO;
        const float *kp = st->kf[kb];
        for (int64_t d = 0; d < Dh; d++) {
            const float *qd = st->qT + d * LP + g * AB_VW;
            AB_V q[AB_NVG];
#pragma GCC unroll 4
            for (int n = 0; n < NV; n++) q[n] = AB_LOAD(qd + n * AB_VW);
#pragma GCC unroll 16
            for (int i = 0; i < KB; i++) {
                const AB_V k = AB_SET1(kp[i * AB_KS + d]);
#pragma GCC unroll 4
                for (int n = 0; n < NV; n++) acc[i][n] = AB_FMA(q[n], k, acc[i][n]);
            }
        }
#pragma GCC unroll 16
        for (int i = 0; i < KB; i++)
#pragma GCC unroll 4
            for (int n = 0; n < NV; n++)
                AB_STORE(st->s + (kb + i) * LP + (g + n) * AB_VW, acc[i][n]);
    }
}

/* Lane vectors AB_NVG at a time (fewer when NV is), the step's keys KB at a time. */
AB_IN void AB_NAME(ab_scores)(ab_state *st, int64_t Dh, const int NV, const int KB) {
    const int NG = NV < AB_NVG ? NV : AB_NVG;
    for (int g = 0; g < NV; g += NG) {
        int kb = 0;
        for (; kb + KB <= AB_VK; kb += KB)
            AB_NAME(ab_scores_kb)(st, Dh, NV * AB_VW, g, NG, kb, KB);
        if (AB_VK % KB) AB_NAME(ab_scores_kb)(st, Dh, NV * AB_VW, g, NG, kb, AB_VK % KB);
    }
}

/* Lanes [x0, x0 + AB_LB) x column vectors [d0, d0 + DB * AB_VW) of o, every key of the step:
 * o[x][d] += p_i[x] * v_i[d], i upward, one fused multiply-add each. */
AB_IN void AB_NAME(ab_pv_tile)(ab_state *st, int LP, int x0, int64_t d0, const int DB) {
    AB_V acc[AB_LB][AB_DB];
#pragma GCC unroll 8
    for (int x = 0; x < AB_LB; x++)
#pragma GCC unroll 8
        for (int j = 0; j < DB; j++) acc[x][j] = AB_LOAD(st->o[x0 + x] + d0 + j * AB_VW);
    for (int i = 0; i < AB_VK; i++) {
        AB_V v[AB_DB];
#pragma GCC unroll 8
        for (int j = 0; j < DB; j++) v[j] = AB_LOAD(st->vf[i] + d0 + j * AB_VW);
#pragma GCC unroll 8
        for (int x = 0; x < AB_LB; x++) {
            const AB_V p = AB_SET1(st->s[i * LP + x0 + x]);
#pragma GCC unroll 8
            for (int j = 0; j < DB; j++) acc[x][j] = AB_FMA(v[j], p, acc[x][j]);
        }
    }
#pragma GCC unroll 8
    for (int x = 0; x < AB_LB; x++)
#pragma GCC unroll 8
        for (int j = 0; j < DB; j++) AB_STORE(st->o[x0 + x] + d0 + j * AB_VW, acc[x][j]);
}

/* A causal edge or a range's end: lane x takes only its first n of the step's keys (the rest are
 * not added at all, so its sums are those of a call that stopped at its last key). */
AB_IN void AB_NAME(ab_pv_edge)(ab_state *st, int LP, int Lu, int64_t DP, int64_t s) {
    for (int x = 0; x < Lu; x++) {
        const int64_t left = st->lim[x] - s;
        const int n = left < 0 ? 0 : left > AB_VK ? AB_VK : (int)left;
        for (int64_t d = 0; d < DP; d += AB_VW) {
            AB_V acc = AB_LOAD(st->o[x] + d);
            for (int i = 0; i < n; i++)
                acc = AB_FMA(AB_LOAD(st->vf[i] + d), AB_SET1(st->s[i * LP + x]), acc);
            AB_STORE(st->o[x] + d, acc);
        }
    }
}

/* One step's softmax over lane vector n: the running max, a rescale of what was summed when it
 * rises (exp(old - new), exactly 1 on lanes whose max held), then p = exp(score - max) in place
 * of the scores and their sum, fp32 within the step and added to the double normaliser. */
AB_IN void AB_NAME(ab_softmax)(ab_state *st, int LP, int n, int64_t DP) {
    float *mp = st->m + n * AB_VW;
    AB_V m = AB_LOAD(mp), cm = m;
    for (int i = 0; i < AB_VK; i++) cm = AB_MAX(cm, AB_LOAD(st->s + i * LP + n * AB_VW));
    _Alignas(64) float f[AB_VW];
    if (AB_ANY_GT(cm, m)) {
        AB_STORE(f, AB_EXP(AB_SUB(m, cm))); /* 0 on a lane's first keys */
        for (int x = 0; x < AB_VW; x++) {
            float *ox = st->o[n * AB_VW + x];
            const AB_V c = AB_SET1(f[x]);
            st->l[n * AB_VW + x] *= (double)f[x];
            for (int64_t d = 0; d < DP; d += AB_VW) AB_STORE(ox + d, AB_MUL(AB_LOAD(ox + d), c));
        }
        m = cm;
        AB_STORE(mp, m);
    }
    AB_V ls = AB_ZERO;
    for (int i = 0; i < AB_VK; i++) {
        float *si = st->s + i * LP + n * AB_VW;
        const AB_V p = AB_EXP(AB_SUB(AB_LOAD(si), m));
        AB_STORE(si, p);
        ls = AB_ADD(ls, p);
    }
    AB_STORE(f, ls);
    for (int x = 0; x < AB_VW; x++) st->l[n * AB_VW + x] += (double)f[x];
}

/* The block over keys [s0, s1) with NV lane vectors (NV * AB_VW >= nq * hb). */
AB_IN void AB_NAME(ab_block)(const cpu_att_blk *a, ab_state *st, const int NV, const int KB) {
    const int LP = NV * AB_VW, hb = a->hb, L = a->nq * a->hb;
    const int Lu = (L + AB_LB - 1) / AB_LB * AB_LB; /* <= LP: AB_LB divides it */
    const int64_t Dh = a->Dh, DP = (Dh + AB_VW - 1) / AB_VW * AB_VW;
    const int64_t rk = a->Dh * (int64_t)cn_dtype_size(a->kdt);
    const int64_t rv = a->Dh * (int64_t)cn_dtype_size(a->vdt);
    /* q transposed, the scale folded in; lanes past the block's are zero */
    for (int x = 0; x < LP; x++) {
        const float *qx =
            x < L ? (const float *)(a->q + (x / hb) * a->q_stride) + (x % hb) * Dh : NULL;
        for (int64_t d = 0; d < Dh; d++) st->qT[d * LP + x] = qx ? qx[d] * a->scale : 0;
    }
    /* the key each lane stops before; a lane that sees no key here, or none at all, runs to s1 */
    int64_t lim_min = a->s1;
    for (int x = 0; x < LP; x++) {
        int64_t e = x < L ? a->pos0 + x / hb + 1 : a->s1;
        st->lim[x] = e <= a->s0 || e > a->s1 ? a->s1 : e;
        if (st->lim[x] < lim_min) lim_min = st->lim[x];
        st->m[x] = -INFINITY;
        st->l[x] = 0;
        for (int64_t d = 0; d < DP; d++) st->o[x][d] = 0;
    }
    for (int64_t s = a->s0; s < a->s1; s += AB_VK) {
        const int nk = a->s1 - s < AB_VK ? (int)(a->s1 - s) : AB_VK;
        const char *kr = a->k0 + s * a->k_stride, *vr = a->v0 + s * a->v_stride;
        const int pf = s + (AB_PF + 1) * AB_VK <= a->s1; /* the rows AB_PF steps ahead exist */
        for (int i = 0; i < nk; i++) {
            AB_ROW(a->kdt, kr + i * a->k_stride, Dh, a->kscale, st->kf[i]);
            AB_ROW(a->vdt, vr + i * a->v_stride, Dh, a->vscale, st->vf[i]);
            if (pf) { /* spread among the decoding, a row of K and one of V per key */
                const char *pk = kr + (i + AB_PF * AB_VK) * a->k_stride;
                const char *pv = vr + (i + AB_PF * AB_VK) * a->v_stride;
                for (int64_t b = 0; b < rk; b += 64) AB_PREFETCH(pk + b);
                for (int64_t b = 0; b < rv; b += 64) AB_PREFETCH(pv + b);
            }
        }
        for (int i = nk; i < AB_VK; i++)
            for (int64_t d = 0; d < DP; d++) st->kf[i][d] = 0;
        AB_NAME(ab_scores)(st, Dh, NV, KB);
        const int edge = lim_min < s + AB_VK;
        if (edge) /* keys a lane does not see leave its max and its sum unchanged */
            for (int x = 0; x < LP; x++)
                for (int64_t i = st->lim[x] - s < 0 ? 0 : st->lim[x] - s; i < AB_VK; i++)
                    st->s[i * LP + x] = -INFINITY;
        for (int n = 0; n < NV; n++) AB_NAME(ab_softmax)(st, LP, n, DP);
        if (edge) {
            AB_NAME(ab_pv_edge)(st, LP, Lu, DP, s);
            continue;
        }
        const int ndv = (int)(DP / AB_VW);
        for (int x0 = 0; x0 < Lu; x0 += AB_LB) {
            int j = 0;
            for (; j + AB_DB <= ndv; j += AB_DB) AB_NAME(ab_pv_tile)(st, LP, x0, j * AB_VW, AB_DB);
            for (; j < ndv; j++) AB_NAME(ab_pv_tile)(st, LP, x0, j * AB_VW, 1);
        }
    }
    for (int x = 0; x < L; x++) {
        memcpy(a->o + x * Dh, st->o[x], (size_t)Dh * sizeof(float));
        a->m[x] = st->m[x];
        a->l[x] = st->l[x];
    }
}

#undef AB_NAME
#undef AB_CAT
#undef AB_CAT_
