/* tensor.c - descriptor helpers; see tensor.h. */
#include "tensor/tensor.h"

#include <string.h>

#include "base/error.h"

static const struct {
    const char *name;
    size_t size;
} g_dtypes[CN_DTYPE_COUNT] = {
    [CN_F32] = {"F32", 4},     [CN_F16] = {"F16", 2},         [CN_BF16] = {"BF16", 2},
    [CN_F8_E4M3] = {"F8_E4M3", 1}, [CN_F8_E5M2] = {"F8_E5M2", 1}, [CN_I8] = {"I8", 1},
    [CN_U8] = {"U8", 1},       [CN_I16] = {"I16", 2},         [CN_I32] = {"I32", 4},
    [CN_I64] = {"I64", 8},     [CN_F64] = {"F64", 8},         [CN_BOOL] = {"BOOL", 1},
    [CN_F8_E8M0] = {"F8_E8M0", 1}, [CN_U16] = {"U16", 2},     [CN_U32] = {"U32", 4},
    [CN_U64] = {"U64", 8},
    [CN_NVFP4] = {"NVFP4", 0}, [CN_MXFP8] = {"MXFP8", 1},
};

size_t cn_dtype_size(cn_dtype t) { return (unsigned)t < CN_DTYPE_COUNT ? g_dtypes[t].size : 0; }

const char *cn_dtype_name(cn_dtype t) {
    return (unsigned)t < CN_DTYPE_COUNT ? g_dtypes[t].name : "?";
}

int cn_dtype_parse(const char *s, cn_dtype *out) {
    /* NVFP4 and MXFP8 are not safetensors dtypes: they are assembled from U8/F8 tensors. */
    for (int i = 0; i < CN_DTYPE_COUNT; i++) {
        if (i == CN_NVFP4 || i == CN_MXFP8) continue;
        if (!strcmp(s, g_dtypes[i].name)) {
            *out = (cn_dtype)i;
            return CN_OK;
        }
    }
    return CN_EDTYPE;
}

static int64_t row_bytes(cn_dtype dtype, int64_t n) {
    if (dtype == CN_NVFP4) return (n + 1) / 2;
    return n * (int64_t)cn_dtype_size(dtype);
}

void cn_tensor_init(cn_tensor *t, cn_dtype dtype, int ndim, const int64_t *shape, void *data) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    t->scale = 1.0f;
    for (int i = 0; i < CN_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    int64_t s = row_bytes(dtype, t->shape[ndim - 1]);
    t->stride[ndim - 1] = dtype == CN_NVFP4 ? 1 : (int64_t)cn_dtype_size(dtype);
    for (int i = ndim - 2; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
    for (int i = ndim; i < CN_MAX_DIMS; i++) t->stride[i] = s;
    t->data = data;
}

cn_tensor cn_tensor_1d(cn_dtype dtype, int64_t n0, void *data) {
    cn_tensor t;
    cn_tensor_init(&t, dtype, 1, &n0, data);
    return t;
}

cn_tensor cn_tensor_2d(cn_dtype dtype, int64_t n0, int64_t n1, void *data) {
    cn_tensor t;
    int64_t shape[2] = {n0, n1};
    cn_tensor_init(&t, dtype, 2, shape, data);
    return t;
}

int64_t cn_tensor_nelem(const cn_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

uint64_t cn_tensor_nbytes(const cn_tensor *t) {
    uint64_t n = (uint64_t)row_bytes(t->dtype, t->shape[t->ndim - 1]);
    for (int i = 0; i < t->ndim - 1; i++) n *= (uint64_t)t->shape[i];
    return n;
}

int cn_tensor_is_contiguous(const cn_tensor *t) {
    int64_t s = row_bytes(t->dtype, t->shape[t->ndim - 1]);
    for (int i = t->ndim - 2; i >= 0; i--) {
        if (t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

cn_tensor cn_tensor_cols(const cn_tensor *t, int64_t col0, int64_t ncol) {
    cn_tensor v = *t;
    v.shape[1] = ncol;
    v.data = (char *)t->data + row_bytes(t->dtype, col0);
    return v;
}

cn_tensor cn_tensor_rows(const cn_tensor *t, int64_t row0, int64_t nrow) {
    cn_tensor v = *t;
    v.shape[0] = nrow;
    v.data = (char *)t->data + row0 * t->stride[0];
    return v;
}

cn_tensor cn_weight_view(const cn_tensor *w, int64_t row0, int64_t nrow, int64_t col0,
                         int64_t ncol, cn_tensor *bs) {
    cn_tensor r = cn_tensor_rows(w, row0, nrow);
    cn_tensor v = cn_tensor_cols(&r, col0, ncol);
    if (w->block_scale) {
        const int64_t blk = w->dtype == CN_NVFP4 ? 16 : 32;
        cn_tensor sr = cn_tensor_rows(w->block_scale, row0, nrow);
        *bs = cn_tensor_cols(&sr, col0 / blk, ncol / blk);
        v.block_scale = bs;
    }
    return v;
}
