/* Safetensors checkpoints: a bounds-checked mmap reader and a streaming writer.
 *
 * Reader: sn_st_open takes a directory (model.safetensors.index.json with a
 * weight_map, else every model*.safetensors file, as mlx-lm globs) or one
 * .safetensors file. Every file is mmapped read-only (or copied into memory
 * by sn_st_copy_to_memory); tensors are views into the maps and stay valid
 * until sn_st_close. The header is untrusted:
 * header length, JSON, dtypes, ranks, dims, data_offsets, shape*dtype size
 * == byte length, offsets inside the file, overlaps and duplicate names are
 * all checked, and every error names the file (and tensor, field).
 *
 * Writer: declare tensors (name, dtype, shape, optionally the bytes), then
 * write one file. Tensors declared without bytes are produced by a fill
 * callback in chunks, so a multi-GB shard never has to sit in memory. The
 * header metadata always starts as {"format":"mlx"}. */
#ifndef SANCTUM_SAFETENSORS_H
#define SANCTUM_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sanctum/manifest.h"
#include "sanctum/status.h"
#include "sanctum/tensor.h"

#define SN_ST_MAX_DIMS 8
/* Largest header we accept (the safetensors spec caps it at 100 MB). */
#define SN_ST_MAX_HEADER (100u * 1024u * 1024u)

typedef struct sn_st_tensor {
    const char *name;
    sn_dtype dtype;                 /* F32/F16/BF16/U32/I32/U8/I8 */
    int ndim;                       /* 0..SN_ST_MAX_DIMS (0 = scalar) */
    int64_t shape[SN_ST_MAX_DIMS];  /* unused dims are 0 */
    const void *data;               /* view into the mmap (NULL when nbytes == 0); aligned to
                                     * the element size when the writer aligned it (ours and
                                     * the safetensors library do): check before casting */
    size_t nbytes;
    const char *file;               /* path of the file holding it */
} sn_st_tensor;

typedef struct sn_st sn_st;

/* Open a directory or a single file (see above). */
sn_status sn_st_open(const char *dir_or_file, sn_st **out);

/* sn_st_open of a model directory whose files the manifest gate verified
 * (sn_manifest_gate_pinned): the index and every shard are opened through
 * sn_manifest_pins_open, so each is checked after open and before it is read
 * or mapped; a file replaced, written to or removed since the gate, and any
 * file the manifest did not list, is refused with SN_E_VERIFY naming it.
 * The shards' fds stay open (one per shard) for sn_st_recheck_pins; the
 * pins are not kept. pins == NULL is plain sn_st_open. */
sn_status sn_st_open_pinned(const char *dir, const sn_manifest_pins *pins, sn_st **out);

/* After the weights were used (uploaded, repacked): every shard of a pinned
 * open is still in the state the gate hashed (SN_E_VERIFY naming it if not),
 * so what was read from the maps is what was verified. */
sn_status sn_st_recheck_pins(const sn_st *st, const sn_manifest_pins *pins);

/* Parse a whole safetensors file image already in memory (no copy: bytes
 * must outlive the handle). label names it in errors. Used by the fuzzer
 * and by tests; sn_st_open uses the same parser. */
sn_status sn_st_open_mem(const void *bytes, size_t len, const char *label, sn_st **out);

void sn_st_close(sn_st *st);  /* accepts NULL */

/* Copy every mapped file into anonymous memory (2 MB aligned, asked for
 * transparent huge pages, read-only once filled) and point the tensors
 * there; the file mappings go. Tensor views taken before the call are
 * stale. Weights read in place for every token (the CPU backend) then
 * cost one TLB entry per 2 MB instead of per 4 KB page-cache page, which
 * in a VM whose page cache holds the file in small pages was 2-5x the
 * 27B's decode speed (docs/PERFORMANCE.md). drop_cache: each copied
 * stretch is dropped from the page cache as soon as it is copied
 * (POSIX_FADV_DONTNEED), for a machine whose memory cannot hold the page
 * cache and the copy at once: there the kernel otherwise reclaims cached
 * pages the copy has yet to read and the load reads them from disk again.
 * On failure (no memory) the files copied so far stay copied, the rest
 * mapped: the handle is valid either way. In-memory images are left as
 * they are. */
sn_status sn_st_copy_to_memory(sn_st *st, bool drop_cache);

/* NULL when absent. */
const sn_st_tensor *sn_st_find(const sn_st *st, const char *name);

/* All tensors, sorted by name: for (i = 0; i < sn_st_count(st); i++) sn_st_at(st, i). */
size_t sn_st_count(const sn_st *st);
const sn_st_tensor *sn_st_at(const sn_st *st, size_t i);

/* A string value from the __metadata__ of the first file (NULL when absent). */
const char *sn_st_metadata(const sn_st *st, const char *key);

/* Total bytes of tensor data over all files. */
size_t sn_st_data_bytes(const sn_st *st);

/* Number of elements of t (product of shape; 1 for a scalar). */
int64_t sn_st_numel(const sn_st_tensor *t);

/* ---- writer ------------------------------------------------------------ */

typedef struct sn_st_writer sn_st_writer;

/* Produce bytes [offset, offset+len) of tensor `index` (its declaration
 * index) into buf. Called tensor by tensor in file order (see
 * sn_st_writer_write), each tensor in increasing offset, chunks of at most
 * 4 MB. */
typedef sn_status (*sn_st_fill_fn)(void *ctx, size_t index, const char *name,
                                   size_t offset, void *buf, size_t len);

sn_status sn_st_writer_new(sn_st_writer **out);
void sn_st_writer_free(sn_st_writer *w);  /* accepts NULL */

/* Add or replace one string in the header metadata, which starts as
 * {"format":"mlx"}. */
sn_status sn_st_writer_set_meta(sn_st_writer *w, const char *key, const char *value);

/* Declare a tensor. data: its bytes (sn_dtype_size(dt) * numel of them; the
 * pointer is kept, not copied, until sn_st_writer_write), or NULL to have
 * the fill callback produce them. Duplicate names are refused. */
sn_status sn_st_writer_add(sn_st_writer *w, const char *name, sn_dtype dt, int ndim,
                           const int64_t *shape, const void *data);

/* Tensors declared so far, and the bytes their data will take. */
size_t sn_st_writer_count(const sn_st_writer *w);
size_t sn_st_writer_data_bytes(const sn_st_writer *w);

/* Write the file. Tensors are laid out by element size (4-byte dtypes
 * first, then 2, then 1), in declaration order within a size, so that every
 * tensor is aligned to its element size with no holes; the header is padded
 * with spaces to a multiple of 8 bytes. fill may be NULL when every tensor had data. The file
 * is written to path.tmp and renamed, so a crash leaves no half file. */
sn_status sn_st_writer_write(sn_st_writer *w, const char *path, sn_st_fill_fn fill, void *ctx);

#endif
