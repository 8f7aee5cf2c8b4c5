/* st_writer.h - streaming safetensors writer: one file, or shards plus an index.
 *
 * Tensors are declared first (name, dtype, shape), so every header is known before any data; the
 * data is then produced chunk by chunk through a callback, so a checkpoint of many GB is written
 * with one bounded buffer (CN_ST_CHUNK bytes) and never held in memory.
 *
 * Layout of each file: 8-byte little-endian header length N, N bytes of JSON
 * `{"__metadata__":{"format":"pt"}, name:{"dtype","shape","data_offsets":[begin,end]}, ...}`
 * padded with spaces so N is a multiple of 8, then the tensors' bytes back to back.
 *
 * Invariants:
 *  (1) Shards are filled greedily in declaration order; a shard exceeds max_shard_bytes only when
 *      it holds a single tensor larger than that.
 *  (2) Within a file, tensors are ordered by element size, largest first (as the reference Rust
 *      writer does), so with the 8-aligned data start every tensor's offset is a multiple of its
 *      element size and a mapped file can be read through typed pointers. Offsets are contiguous
 *      (no holes), which the reference reader requires.
 *  (3) Nothing is ever left under a final name half-written: every file is written to
 *      `<name>.tmp` and renamed only once all files are complete; on any error the temporaries are
 *      removed and the directory keeps whatever it held before.
 *  (4) A successful write also removes the other layout's top-level file (model.safetensors when
 *      sharded, model.safetensors.index.json when not), so a loader never sees both.
 */
#ifndef CN_ST_WRITER_H
#define CN_ST_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "tensor/tensor.h"

/* Largest chunk the fill callback is asked for; a multiple of 8, so chunks split no element. */
#define CN_ST_CHUNK ((uint64_t)4 << 20)

/* Produces bytes [offset, offset + nbytes) of tensor `index` (declaration order) into buf.
 * offset and nbytes are multiples of the element size. Returns 0 or a negative CN_E code, which
 * aborts the write and is returned by cn_st_writer_write. */
typedef int (*cn_st_fill_fn)(void *ctx, int index, const char *name, uint64_t offset, void *buf,
                             uint64_t nbytes);

typedef struct cn_st_writer cn_st_writer; /* layout private to st_writer.c */

/* Creates an empty writer. Returns 0, or CN_ENOMEM with *out untouched. */
int cn_st_writer_new(cn_st_writer **out, cn_err *err);
/* Frees the writer and its declarations; safe on NULL. */
void cn_st_writer_free(cn_st_writer *w);

/* Declares a tensor. ndim 0 is a scalar (one element). dtype must have a byte size (not NVFP4).
 * Returns 0; CN_EINVAL for a duplicate or empty name, bad rank, negative dimension or a dtype
 * without an element size; CN_ENOMEM. On error the writer is unchanged. */
int cn_st_writer_add(cn_st_writer *w, const char *name, cn_dtype dtype, int ndim,
                     const int64_t *shape, cn_err *err);

/* Number of declared tensors, and the sum of their data bytes. */
int cn_st_writer_count(const cn_st_writer *w);
uint64_t cn_st_writer_total_bytes(const cn_st_writer *w);

/* Number of files a write with this max_shard_bytes produces (1 means model.safetensors). */
int cn_st_writer_plan(const cn_st_writer *w, uint64_t max_shard_bytes);

/* Writes every declared tensor into dir (which must exist). max_shard_bytes 0 means one file,
 * `model.safetensors`; otherwise tensors are split into `model-0000i-of-0000n.safetensors` plus
 * `model.safetensors.index.json` (a single shard is still written as `model.safetensors`, as
 * transformers does). Returns 0; CN_EIO naming the path when a file cannot be created, written
 * (disk full included), closed or renamed; the fill callback's code if it fails, with a message
 * naming the tensor and then the callback's own (a callback that reports through this same `err`
 * keeps its message; otherwise the code's description); CN_ENOMEM. See invariant (3) for what an error leaves behind. */
int cn_st_writer_write(cn_st_writer *w, const char *dir, uint64_t max_shard_bytes,
                       cn_st_fill_fn fill, void *ctx, cn_err *err);

/* Writes len bytes to path through `path.tmp` + rename, so path is either the old file or the
 * complete new one. Returns 0 or CN_EIO naming the path. */
int cn_write_file_atomic(const char *path, const void *data, size_t len, cn_err *err);

#endif
