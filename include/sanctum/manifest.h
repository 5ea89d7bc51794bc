/* Signed SHA-256 weight manifests: the gate that runs before any weight of a
 * model directory is mapped.
 *
 * A manifest is the text that coreutils `sha256sum` / `shasum -a 256` writes:
 * one line per file, `<64 hex>  <path>` (text mode) or `<64 hex> *<path>`
 * (binary mode), paths relative to the model directory. Absolute paths, `..`
 * components, duplicates, backslash-escaped names and blank paths are refused.
 * The optional detached signature is a raw 64-byte ed25519 signature over the
 * manifest file's exact bytes; the public key is a raw 32-byte ed25519 key.
 *
 * Order of checks in sn_manifest_gate (all failures name what was wrong):
 *   1. read the manifest bytes (size-capped);
 *   2. signature, before any hash: with pubkey_path set, the signature
 *      (sig_path, or "<manifest_path>.sig" when sig_path is NULL) must exist
 *      and verify, else SN_E_VERIFY. sig_path without pubkey_path is
 *      SN_E_INVALID. No pubkey + require_signed is SN_E_VERIFY; no pubkey
 *      otherwise passes with report->signature_checked=0 and a loud warning
 *      on stderr;
 *   3. parse (SN_E_FORMAT naming manifest:line);
 *   4. coverage: every weight file of the model dir (*.safetensors,
 *      *.safetensors.index.json, config.json, tokenizer.json,
 *      tokenizer_config.json, generation_config.json, special_tokens_map.json,
 *      chat_template.jinja, chat_template.json, tekken.json, params.json), in
 *      sub-directories too, must be listed, else SN_E_VERIFY naming it;
 *   5. hash every listed file on n_threads threads with streaming reads of a
 *      fixed buffer (never the whole file in memory): missing file is
 *      SN_E_MISSING naming it, a differing digest is SN_E_VERIFY naming it,
 *      and so is a file that changed while it was being hashed.
 *
 * Everything here is thread-safe and reentrant; no function calls exit(). */
#ifndef SANCTUM_MANIFEST_H
#define SANCTUM_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "sanctum/status.h"

#define SN_MANIFEST_MAX_BYTES (16u << 20)   /* a manifest bigger than this is refused */
#define SN_ED25519_SIG_BYTES 64
#define SN_ED25519_PUB_BYTES 32
#define SN_ED25519_SEED_BYTES 32

typedef struct sn_manifest_entry {
    char *path;                   /* relative, normalised ("./a" -> "a"), NUL-terminated */
    unsigned char sha256[32];
    int line;                     /* 1-based line in the manifest, for messages */
} sn_manifest_entry;

typedef struct sn_manifest {
    sn_manifest_entry *entries;   /* [n] in file order */
    size_t n;
} sn_manifest;

/* Parse manifest text. `name` is only used in error messages ("<name>:<line>:
 * ..."). The buffer need not be NUL-terminated. *out is freed with
 * sn_manifest_free. */
sn_status sn_manifest_parse(const char *buf, size_t len, const char *name, sn_manifest **out);
void sn_manifest_free(sn_manifest *m);

/* Read a whole small file (manifest, signature, key) into a malloc'd buffer,
 * refusing files larger than max_bytes. *out is NUL-terminated for
 * convenience (not counted in *len). */
sn_status sn_manifest_read_file(const char *path, size_t max_bytes, unsigned char **out, size_t *len);

/* True when `rel` (a path relative to the model dir) names a file the gate
 * requires to be listed (see rule 4 above). */
int sn_manifest_is_weight_file(const char *rel);

/* SHA-256 of one file, streamed through a fixed buffer. *bytes (optional)
 * receives the file size. SN_E_MISSING when it does not exist. */
sn_status sn_sha256_file(const char *path, unsigned char out[32], uint64_t *bytes);

/* Build manifest text for every regular file of model_dir that
 * sn_manifest_is_weight_file accepts (recursing into sub-directories), sorted
 * by path, hashed on n_threads threads (0 = online CPUs). *text is malloc'd
 * sha256sum-format text ending in '\n'. */
sn_status sn_manifest_create(const char *model_dir, int n_threads, char **text, size_t *len);

/* ed25519 (RFC 8032, pure) verify of msg with a raw 32-byte public key.
 * SN_E_VERIFY with OpenSSL's error text on a bad signature. */
sn_status sn_ed25519_verify(const unsigned char *msg, size_t len,
                            const unsigned char sig[SN_ED25519_SIG_BYTES],
                            const unsigned char pub[SN_ED25519_PUB_BYTES]);
/* Sign with a raw 32-byte private seed. */
sn_status sn_ed25519_sign(const unsigned char *msg, size_t len,
                          const unsigned char seed[SN_ED25519_SEED_BYTES],
                          unsigned char sig[SN_ED25519_SIG_BYTES]);
/* Raw public key of a raw private seed. */
sn_status sn_ed25519_public(const unsigned char seed[SN_ED25519_SEED_BYTES],
                            unsigned char pub[SN_ED25519_PUB_BYTES]);
/* Load a private key file: PKCS#8 PEM (what `sign_manifest keygen` and
 * `openssl genpkey -algorithm ed25519` write) or a raw 32-byte seed. */
sn_status sn_ed25519_load_private(const char *path, unsigned char seed[SN_ED25519_SEED_BYTES]);
/* Load a public key file: exactly 32 raw bytes, or a PEM SubjectPublicKeyInfo. */
sn_status sn_ed25519_load_public(const char *path, unsigned char pub[SN_ED25519_PUB_BYTES]);

/* Verify model_dir against a parsed manifest: steps 4 and 5 above. */
sn_status sn_manifest_verify_dir(const sn_manifest *m, const char *model_dir, int n_threads,
                                 uint64_t *bytes_hashed);

typedef struct sn_manifest_opts {
    const char *manifest_path;    /* required */
    const char *sig_path;         /* NULL: "<manifest_path>.sig" when pubkey_path is set */
    const char *pubkey_path;      /* NULL: unsigned (fatal with require_signed) */
    int require_signed;           /* --require-signed-manifest */
    int n_threads;                /* 0 = online CPUs, capped at the number of files */
    int quiet;                    /* 1: no progress/warning lines on stderr */
} sn_manifest_opts;

typedef struct sn_manifest_report {
    double seconds;               /* whole gate wall time: the server's
                                     sanctum_mlx_startup_seconds{phase="manifest_verify"} */
    double hash_seconds;          /* of which hashing */
    uint64_t bytes;               /* bytes hashed */
    size_t n_files;               /* files listed and verified */
    int signature_checked;        /* 1 when an ed25519 signature verified */
} sn_manifest_report;

/* The whole gate (steps 1-5). report may be NULL. */
sn_status sn_manifest_gate(const char *model_dir, const sn_manifest_opts *opts, sn_manifest_report *report);

/* Pins close the gap between "the gate hashed the file" and "the loader
 * mapped it": the gate records each hashed file's identity and state
 * (device, inode, size, mtime, ctime, checked again after hashing), and the
 * loader checks the fd it is about to mmap against them. A file replaced
 * (rename, new inode) or written to (mtime/ctime) after the gate is refused.
 * *pins is set only on SN_OK; free with sn_manifest_pins_free. */
typedef struct sn_manifest_pins sn_manifest_pins;
sn_status sn_manifest_gate_pinned(const char *model_dir, const sn_manifest_opts *opts, sn_manifest_report *report,
                                  sn_manifest_pins **pins);
/* rel: the path relative to the model dir, as in the manifest ("./" allowed).
 * SN_E_VERIFY naming it when rel was not verified or fd is not that file in
 * the state it was hashed in. */
sn_status sn_manifest_pins_check_fd(const sn_manifest_pins *pins, const char *rel, int fd);
/* Open model_dir/rel read-only and check the fd against the pins before the
 * caller reads or maps a byte of it (the loader's way in: safetensors
 * shards and index, config.json, generation_config.json, the tokenizer).
 * *fd (caller closes) is set only on SN_OK. A file that does not exist is
 * SN_E_MISSING when the manifest does not list it (an optional file that is
 * simply absent) and SN_E_VERIFY when it does (verified, then removed); an
 * existing file the manifest does not list is SN_E_VERIFY. */
sn_status sn_manifest_pins_open(const sn_manifest_pins *pins, const char *model_dir, const char *rel, int *fd);
void sn_manifest_pins_free(sn_manifest_pins *pins);

#endif
