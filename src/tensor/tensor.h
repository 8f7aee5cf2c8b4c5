/* tensor.h - tensor descriptors: dtype, shape, byte strides and where the data lives.
 *
 * A cn_tensor never owns its data: weights point into a mapped file, activations into memory a
 * backend allocated (cn_backend_alloc / cn_backend_release). Shapes are listed outermost first, as
 * PyTorch and safetensors list them: a weight of shape {N, K} has N rows of K values, and
 * y = x W^T maps x:[T, K] to y:[T, N].
 *
 * Invariants:
 *  (1) ndim in 1..CN_MAX_DIMS; unused trailing shape entries are 1.
 *  (2) stride[] is in bytes; the innermost dimension is always contiguous (stride[ndim-1] == one
 *      element, or one packed block row for sub-byte/blocked formats). Outer strides may be larger
 *      than the packed size: a column slice of an activation is a view with the parent's row stride.
 *  (3) Quantized weights carry their dequantization alongside: F8 with a per-tensor `scale`; NVFP4
 *      with `block_scale` (E4M3, one per 16) and `scale` (the fp32 global); MXFP8 with
 *      `block_scale` (E8M0, one per 32). For every other dtype scale == 1 and block_scale == NULL.
 */
#ifndef CN_TENSOR_H
#define CN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#define CN_MAX_DIMS 4

typedef enum cn_dtype {
    CN_F32 = 0,
    CN_F16,
    CN_BF16,
    CN_F8_E4M3, /* "fn" variant; per-tensor scale in cn_tensor.scale */
    CN_F8_E5M2,
    CN_I8,
    CN_U8,
    CN_I16,
    CN_I32,
    CN_I64,
    CN_F64,
    CN_BOOL,
    CN_F8_E8M0, /* power-of-two scales (MXFP8 blocks) */
    CN_U16,
    CN_U32,
    CN_U64,
    CN_NVFP4, /* packed E2M1 pairs, low nibble first; block_scale E4M3 per 16; scale = global */
    CN_MXFP8, /* E4M3 values; block_scale E8M0 per 32 */
    CN_DTYPE_COUNT
} cn_dtype;

typedef enum cn_where {
    CN_HOST = 0, /* ordinary host memory or a host mapping */
    CN_DEVICE,   /* memory of the backend's accelerator */
} cn_where;

typedef struct cn_tensor {
    cn_dtype dtype;
    int ndim;
    int64_t shape[CN_MAX_DIMS];  /* outermost first */
    int64_t stride[CN_MAX_DIMS]; /* bytes */
    void *data;                  /* not owned */
    cn_where where;
    float scale;                           /* per-tensor dequant scale (F8, NVFP4 global), else 1 */
    const struct cn_tensor *block_scale;   /* NVFP4/MXFP8 block scales, else NULL */
    const char *name;                      /* for messages; may be NULL; not owned */
} cn_tensor;

/* Element size in bytes; 0 for sub-byte or blocked dtypes (NVFP4). */
size_t cn_dtype_size(cn_dtype t);
/* safetensors' spelling ("F32", "BF16", "F8_E4M3", ...); "?" for out of range. */
const char *cn_dtype_name(cn_dtype t);
/* Parses a safetensors dtype string; returns 0 and sets *out, or CN_EDTYPE. */
int cn_dtype_parse(const char *s, cn_dtype *out);

/* Fills a contiguous descriptor (strides from shape) over data. n dims given in shape. */
void cn_tensor_init(cn_tensor *t, cn_dtype dtype, int ndim, const int64_t *shape, void *data);
/* Shorthands for the common ranks. */
cn_tensor cn_tensor_1d(cn_dtype dtype, int64_t n0, void *data);
cn_tensor cn_tensor_2d(cn_dtype dtype, int64_t n0, int64_t n1, void *data);
/* Number of elements (product of shape). */
int64_t cn_tensor_nelem(const cn_tensor *t);
/* Bytes spanned by a contiguous tensor of this shape. */
uint64_t cn_tensor_nbytes(const cn_tensor *t);
/* 1 if rows are packed back to back (no gaps). */
int cn_tensor_is_contiguous(const cn_tensor *t);
/* A view of columns [col0, col0+ncol) of a 2D tensor; keeps the parent's row stride. */
cn_tensor cn_tensor_cols(const cn_tensor *t, int64_t col0, int64_t ncol);
/* A view of rows [row0, row0+nrow) of a 2D tensor. */
cn_tensor cn_tensor_rows(const cn_tensor *t, int64_t row0, int64_t nrow);
/* The block [row0, row0+nrow) x [col0, col0+ncol) of a 2D weight, block scales included: for
 * NVFP4 and MXFP8 *bs becomes the view of the scales, and the result points at it (the caller
 * keeps *bs alive as long as the view); col0 and ncol must then be multiples of the scale block
 * (16, 32). */
cn_tensor cn_weight_view(const cn_tensor *w, int64_t row0, int64_t nrow, int64_t col0,
                         int64_t ncol, cn_tensor *bs);
/* Pointer to row r of a 2D tensor (host or device address arithmetic only). */
static inline void *cn_tensor_row(const cn_tensor *t, int64_t r) {
    return (char *)t->data + r * t->stride[0];
}
/* Exchanges the buffers of a and b (tensors of one layout: a state and its spare take turns). */
static inline void cn_tensor_swap_data(cn_tensor *a, cn_tensor *b) {
    void *t = a->data;
    a->data = b->data;
    b->data = t;
}

#endif
