/* Loading a checkpoint and running it: the API the server and tools use.
 *
 * sn_model is immutable after load and shared; sn_seq is one sequence's
 * state (KV caches for attention layers, conv + recurrent state for
 * GatedDeltaNet layers, position). States can be snapshotted and restored
 * because recurrent state cannot be truncated: the prompt cache and
 * speculative decoding rely on that. */
#ifndef SANCTUM_MODEL_H
#define SANCTUM_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "sanctum/backend.h"
#include "sanctum/manifest.h"

typedef struct sn_model sn_model;
typedef struct sn_seq sn_seq;
typedef struct sn_snapshot sn_snapshot;

/* Where the weights live while the model runs (sn_load_opts.weights). */
typedef enum {
    /* the CPU backend: COPY when the weights fit in MemAvailable with
     * SN_WEIGHTS_COPY_SPARE_MB to spare, else MMAP; the CUDA backend: MMAP
     * (the host bytes are read once, for the upload) */
    SN_WEIGHTS_AUTO = 0,
    SN_WEIGHTS_MMAP,  /* read in place from the file mappings (the page cache) */
    SN_WEIGHTS_COPY,  /* copied into anonymous memory in huge pages (sn_st_copy_to_memory) */
} sn_weights_mode;

#define SN_WEIGHTS_COPY_SPARE_MB 2048

/* "auto", "mmap", "copy" -> the mode; false for any other string */
bool sn_weights_mode_parse(const char *s, sn_weights_mode *out);

/* The activations of quantized products (sn_load_opts.precision). */
typedef enum {
    /* fp32-class: x kept to 22-24 bits in every product (CPU: three int8
     * digit planes; CUDA: the same on decode, fp16 hi + lo in prefill) */
    SN_PRECISION_EXACT = 0,
    /* faster, approximate: CPU Q4 weights against 8-bit activations (AVX2
     * and AVX-512; the scalar kernels stay exact); CUDA prefill GEMMs on x
     * rounded to fp16 in one pass (decode unchanged). See the backend op
     * set_fast. */
    SN_PRECISION_FAST,
} sn_precision;

/* "exact", "fast" -> the precision; false for any other string */
bool sn_precision_parse(const char *s, sn_precision *out);
/* the precision's name, as sn_precision_parse takes it */
const char *sn_precision_name(sn_precision p);

typedef struct {
    sn_backend_kind backend;  /* CPU (default) or CUDA */
    int gpu;                  /* CUDA device index */
    int n_threads;            /* CPU threads; <=0: one per core */
    int quantize_bits;        /* 0: as stored; 4 or 8: quantize raw HF weights at load */
    int64_t memory_limit_mb;  /* 0: no limit; else refuse a model whose weights exceed it */
    sn_weights_mode weights;  /* AUTO (default), MMAP or COPY */
    sn_precision precision;   /* EXACT (default) or FAST */
    /* Optional: progress of the load in [0, 1] (binding and quantizing layer
     * by layer, then the upload), for a terminal bar or log milestones. */
    void (*progress)(void *ud, double frac);
    void *progress_ud;
    /* Optional: pins from sn_manifest_gate_pinned on this same dir. Then
     * config.json, generation_config.json, the safetensors index and every
     * shard are opened through them (checked after open, before a byte is
     * read or mapped), and after the weights are bound and uploaded every
     * shard is checked again: a file replaced, written to, removed or added
     * since the gate fails the load with SN_E_VERIFY naming it. Only
     * borrowed during sn_model_load. */
    const sn_manifest_pins *pins;
} sn_load_opts;

typedef struct {
    const char *model_type;   /* "qwen3_5", "qwen3_5_moe", "qwen2", "mistral" */
    const char *name;         /* model id shown to clients (directory base name) */
    int vocab_size;
    int hidden_size;
    int n_layers;
    int max_ctx;              /* max_position_embeddings */
    int32_t eos_ids[8];       /* from generation_config.json, else config */
    int n_eos;
    int32_t bos_id;           /* -1 when none */
    bool mlx_layout;          /* true: MLX-converted checkpoint; false: raw HF */
    int64_t weight_bytes;     /* bytes of weights as stored (for bandwidth figures) */
    bool weights_copied;      /* in anonymous memory (sn_load_opts.weights), not the file mappings */
    sn_precision precision;   /* as loaded (sn_load_opts.precision) */
} sn_model_info;

sn_status sn_model_load(const char *dir, const sn_load_opts *opts, sn_model **out);
void sn_model_free(sn_model *m);
const sn_model_info *sn_model_get_info(const sn_model *m);

/* max_ctx <= 0: the model's max_position_embeddings (capped to 32768). */
sn_status sn_seq_new(sn_model *m, int max_ctx, sn_seq **out);
void sn_seq_free(sn_seq *s);
int sn_seq_pos(const sn_seq *s);       /* tokens consumed so far */
int sn_seq_max_ctx(const sn_seq *s);
void sn_seq_reset(sn_seq *s);           /* back to position 0, states zeroed */
/* Bytes of state one snapshot holds at the current position. */
size_t sn_seq_state_bytes(const sn_seq *s);

/* Run n tokens through the model at the sequence's position.
 * logits: host buffer; when all_logits, [n, vocab], else [vocab] for the last token.
 * logits may be NULL (prefill without output). */
sn_status sn_forward(sn_model *m, sn_seq *s, const int32_t *tokens, int n, float *logits, bool all_logits);

/* One item of a batched step: a sequence and its run of new tokens (a
 * prefill chunk or one decode token). */
typedef struct {
    sn_seq *seq;
    const int32_t *tokens;    /* host, n ids in [0, vocab) */
    int n;                    /* >= 1 */
    float *logits;            /* host; NULL, [vocab] (last token) or [n, vocab] when all_logits */
    bool all_logits;
    /* Optional: the greedy next token (argmax of the last token's logits,
     * first on ties, NaN never wins) is written here. Computed on the
     * backend when it has the op, so a greedy decode step moves only the id
     * to the host (and runs as one CUDA graph); logits may then be NULL. */
    int32_t *next_id;
    /* With next_id: the argmax of every row into next_id[0..n) (a verify
     * pass's greedy tokens), not only the last row's. */
    bool all_ids;
    /* Optional: ids no argmax of this item returns, as if their logits were
     * -inf (embedding rows the tokenizer cannot decode). A row whose argmax
     * is one of them has its logits fetched and the argmax taken again on
     * the host with them masked: the id that masking first gives. */
    const int32_t *banned;
    int n_banned;
    /* Optional, with next_id, on a backend that draws (sn_model_can_sample):
     * next_id[k] <- the backend's draw for sample[k] (sn_backend_ops.sample)
     * from row sample[k].row of this item (0..n-1), k < n_sample; the
     * rows' edits and bans go with them (sn_sampler_device_rows), and no
     * logits reach the host. Not with all_ids. */
    const sn_sample_row *sample;
    int n_sample;
} sn_batch_item;

/* Runs several sequences (each at its own position, each seq at most once)
 * through the model together: the projections see all rows at once, the
 * attention / recurrent parts run per sequence. Work beyond
 * sn_model_step_tokens() rows is split into several steps. Results are
 * bitwise the same as running each item alone (backend ops are batch
 * invariant). On failure the states of the sequences involved are
 * undefined: reset or restore them before reuse. */
sn_status sn_forward_batch(sn_model *m, const sn_batch_item *items, int n_items);
/* sn_forward for greedy decoding: runs n tokens and writes only the argmax
 * of the last token's logits to *next_id (see sn_batch_item.next_id). */
sn_status sn_forward_greedy(sn_model *m, sn_seq *s, const int32_t *tokens, int n, int32_t *next_id);
/* True when the backend draws tokens itself (sn_batch_item.sample). */
bool sn_model_can_sample(const sn_model *m);
/* Rows one internal step takes (prefill chunk size). */
int sn_model_step_tokens(const sn_model *m);

/* Snapshot holds a full copy of the sequence state (host or backend memory). */
sn_status sn_seq_snapshot(const sn_seq *s, sn_snapshot **out);
sn_status sn_seq_restore(sn_seq *s, const sn_snapshot *snap);
int sn_snapshot_pos(const sn_snapshot *snap);
size_t sn_snapshot_bytes(const sn_snapshot *snap);
void sn_snapshot_free(sn_snapshot *snap);

#endif
