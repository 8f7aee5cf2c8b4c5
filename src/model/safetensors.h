/* safetensors.h - memory-mapped safetensors checkpoints: one file or an index of shards.
 *
 * cn_st_open_dir() maps `model.safetensors`, or every shard named by
 * `model.safetensors.index.json`, parses each header and builds a name index. Tensor data is never
 * copied: cn_st_tensor.data points into the mapping, valid until cn_st_close().
 * Every defect is an error naming the file and, where it applies, the tensor: missing/unreadable
 * file (CN_ENOENT/CN_EIO), truncated file or data past the end (CN_ETRUNC), malformed header JSON,
 * bad offsets, overlapping or misordered data (CN_EFORMAT), unknown dtype (CN_EDTYPE), index naming
 * a shard that is missing or a tensor not in its shard (CN_EFORMAT / CN_ENOENT).
 */
#ifndef CN_SAFETENSORS_H
#define CN_SAFETENSORS_H

#include <stdint.h>

#include "base/error.h"
#include "tensor/tensor.h"

typedef struct cn_st_tensor {
    const char *name;          /* owned by the cn_safetensors */
    cn_dtype dtype;            /* as stored: F32, BF16, F16, F8_E4M3, U8, ... */
    int ndim;                  /* 0 for a scalar */
    int64_t shape[CN_MAX_DIMS];
    const void *data;          /* into the mapping */
    uint64_t nbytes;
    int file;                  /* index of the shard it came from */
} cn_st_tensor;

typedef struct cn_safetensors cn_safetensors;

/* Opens the checkpoint in dir. *out is set only on success. */
int cn_st_open_dir(cn_safetensors **out, const char *dir, cn_err *err);
/* Opens one .safetensors file. */
int cn_st_open_file(cn_safetensors **out, const char *path, cn_err *err);
void cn_st_close(cn_safetensors *st);

/* The tensor called name, or NULL. */
const cn_st_tensor *cn_st_find(const cn_safetensors *st, const char *name);
int cn_st_count(const cn_safetensors *st);
const cn_st_tensor *cn_st_at(const cn_safetensors *st, int i);
/* Path of shard i (for messages). */
const char *cn_st_file_path(const cn_safetensors *st, int i);

#endif
