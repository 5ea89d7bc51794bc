/* sign_manifest: make, sign and check SHA-256 weight manifests.
 *
 *   sign_manifest keygen --out KEY [--force]
 *       ed25519 private key to KEY (PKCS#8 PEM, mode 0600, never overwritten
 *       without --force), the 32-byte raw public key to KEY.pub
 *   sign_manifest create --model DIR [--threads N] > manifest
 *       sha256sum-format lines for every weight file of DIR
 *   sign_manifest sign --key KEY manifest [--out SIG]
 *       64-byte detached ed25519 signature over the manifest bytes to
 *       manifest.sig (or SIG)
 *   sign_manifest verify --pubkey PUB manifest [--sig SIG] [--model DIR]
 *       exit 0 when the signature (and, with --model, every hash) verifies,
 *       1 with the reason otherwise; 2 for a usage error
 *
 * The crypto and parsing live in libsanctum (src/io/manifest.c) so that the
 * tool and the server can never disagree about what "verified" means. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "sanctum/manifest.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage:\n"
            "  sign_manifest keygen --out KEY [--force]\n"
            "  sign_manifest create --model DIR [--threads N] > manifest\n"
            "  sign_manifest sign --key KEY MANIFEST [--out SIG]\n"
            "  sign_manifest verify --pubkey PUB MANIFEST [--sig SIG] [--model DIR] [--threads N]\n");
}

static int fail(const char *what)
{
    fprintf(stderr, "sign_manifest: %s: %s\n", what, sn_errmsg());
    return 1;
}

/* Write all of buf to path, creating it with `mode`; O_EXCL unless force. */
static int write_all(const char *path, const void *buf, size_t len, int mode, int force)
{
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (force ? O_TRUNC : O_EXCL);
    int fd = open(path, flags, mode);
    if (fd < 0) {
        fprintf(stderr, "sign_manifest: %s: %s%s\n", path, strerror(errno),
                errno == EEXIST ? " (use --force to replace it)" : "");
        return -1;
    }
    /* An existing file keeps its old mode under O_TRUNC: set ours. */
    if (fchmod(fd, (mode_t)mode) != 0) {
        fprintf(stderr, "sign_manifest: %s: chmod: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    const unsigned char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fprintf(stderr, "sign_manifest: %s: write: %s\n", path, strerror(errno));
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        fprintf(stderr, "sign_manifest: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int cmd_keygen(int argc, char **argv)
{
    const char *out = NULL;
    int force = 0, rc = 1;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--force") == 0)
            force = 1;
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        usage(stderr);
        return 2;
    }
    EVP_PKEY *key = NULL;
    EVP_PKEY_CTX *kctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
    BIO *mem = NULL;
    char pubpath[4096];
    unsigned char pub[SN_ED25519_PUB_BYTES];
    size_t pl = sizeof pub;
    if ((size_t)snprintf(pubpath, sizeof pubpath, "%s.pub", out) >= sizeof pubpath) {
        fprintf(stderr, "sign_manifest: %s: path too long\n", out);
        goto out;
    }
    if (!kctx || EVP_PKEY_keygen_init(kctx) != 1 || EVP_PKEY_keygen(kctx, &key) != 1 ||
        EVP_PKEY_get_raw_public_key(key, pub, &pl) != 1 || pl != sizeof pub) {
        fprintf(stderr, "sign_manifest: ed25519 keygen: %s\n", ERR_error_string(ERR_get_error(), NULL));
        goto out;
    }
    mem = BIO_new(BIO_s_mem());
    if (!mem || PEM_write_bio_PrivateKey(mem, key, NULL, NULL, 0, NULL, NULL) != 1) {
        fprintf(stderr, "sign_manifest: PEM encode: %s\n", ERR_error_string(ERR_get_error(), NULL));
        goto out;
    }
    char *pem = NULL;
    long pem_len = BIO_get_mem_data(mem, &pem);
    if (pem_len <= 0 || write_all(out, pem, (size_t)pem_len, 0600, force) != 0)
        goto out;
    if (write_all(pubpath, pub, sizeof pub, 0644, force) != 0) {
        unlink(out);   /* a private key without its public half is useless and confusing */
        goto out;
    }
    fprintf(stderr, "sign_manifest: wrote private key %s (0600) and public key %s (32 bytes)\n", out, pubpath);
    rc = 0;
out:
    BIO_free(mem);   /* BIO_s_mem frees its buffer; key bytes are not cached elsewhere */
    EVP_PKEY_free(key);
    EVP_PKEY_CTX_free(kctx);
    return rc;
}

static int cmd_create(int argc, char **argv)
{
    const char *model = NULL;
    int threads = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        usage(stderr);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    if (sn_manifest_create(model, threads, &text, &len) != SN_OK)
        return fail(model);
    int rc = fwrite(text, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
    if (rc)
        fprintf(stderr, "sign_manifest: writing the manifest to stdout: %s\n", strerror(errno));
    free(text);
    return rc;
}

static int cmd_sign(int argc, char **argv)
{
    const char *keyp = NULL, *manifest = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--key") == 0 && i + 1 < argc)
            keyp = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (argv[i][0] != '-' && !manifest)
            manifest = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!keyp || !manifest) {
        usage(stderr);
        return 2;
    }
    char sigpath[4096];
    if (!out) {
        if ((size_t)snprintf(sigpath, sizeof sigpath, "%s.sig", manifest) >= sizeof sigpath) {
            fprintf(stderr, "sign_manifest: %s: path too long\n", manifest);
            return 1;
        }
        out = sigpath;
    }
    unsigned char seed[SN_ED25519_SEED_BYTES], pub[SN_ED25519_PUB_BYTES], sig[SN_ED25519_SIG_BYTES];
    unsigned char *text = NULL;
    size_t len = 0;
    int rc = 1;
    if (sn_ed25519_load_private(keyp, seed) != SN_OK) {
        rc = fail(keyp);
        goto out;
    }
    if (sn_manifest_read_file(manifest, SN_MANIFEST_MAX_BYTES, &text, &len) != SN_OK) {
        rc = fail(manifest);
        goto out;
    }
    /* Signing a file the server would refuse to parse helps nobody. */
    sn_manifest *m = NULL;
    if (sn_manifest_parse((const char *)text, len, manifest, &m) != SN_OK) {
        rc = fail("refusing to sign");
        goto out;
    }
    sn_manifest_free(m);
    if (sn_ed25519_sign(text, len, seed, sig) != SN_OK || sn_ed25519_public(seed, pub) != SN_OK ||
        sn_ed25519_verify(text, len, sig, pub) != SN_OK) {
        rc = fail("sign");
        goto out;
    }
    if (write_all(out, sig, sizeof sig, 0644, 1) != 0)
        goto out;
    fprintf(stderr, "sign_manifest: wrote %s (ed25519, 64 bytes)\n", out);
    rc = 0;
out:
    OPENSSL_cleanse(seed, sizeof seed);
    free(text);
    return rc;
}

static int cmd_verify(int argc, char **argv)
{
    const char *pubp = NULL, *manifest = NULL, *sigp = NULL, *model = NULL;
    int threads = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--pubkey") == 0 && i + 1 < argc)
            pubp = argv[++i];
        else if (strcmp(argv[i], "--sig") == 0 && i + 1 < argc)
            sigp = argv[++i];
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !manifest)
            manifest = argv[i];
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!pubp || !manifest) {
        usage(stderr);
        return 2;
    }
    sn_manifest_opts o = { .manifest_path = manifest, .sig_path = sigp, .pubkey_path = pubp,
                           .require_signed = 1, .n_threads = threads, .quiet = 1 };
    if (model) {
        sn_manifest_report rep;
        if (sn_manifest_gate(model, &o, &rep) != SN_OK) {
            fprintf(stderr, "FAIL: %s\n", sn_errmsg());
            return 1;
        }
        printf("OK: %s: signature valid; %zu files, %.2f GB match in %s (%.2f s)\n", manifest, rep.n_files,
               (double)rep.bytes / 1e9, model, rep.seconds);
        return 0;
    }
    /* Signature only: same checks as the gate's step 2, then a parse so a
     * validly signed but malformed manifest is still reported. */
    unsigned char pub[SN_ED25519_PUB_BYTES], *text = NULL, *sig = NULL;
    size_t len = 0, sl = 0;
    char defsig[4096];
    int rc = 1;
    if (!sigp) {
        snprintf(defsig, sizeof defsig, "%s.sig", manifest);
        sigp = defsig;
    }
    sn_manifest *m = NULL;
    if (sn_ed25519_load_public(pubp, pub) != SN_OK || sn_manifest_read_file(sigp, 4096, &sig, &sl) != SN_OK ||
        sn_manifest_read_file(manifest, SN_MANIFEST_MAX_BYTES, &text, &len) != SN_OK) {
        fprintf(stderr, "FAIL: %s\n", sn_errmsg());
        goto out;
    }
    if (sl != SN_ED25519_SIG_BYTES) {
        fprintf(stderr, "FAIL: %s: %zu bytes; an ed25519 signature is exactly 64 bytes\n", sigp, sl);
        goto out;
    }
    if (sn_ed25519_verify(text, len, sig, pub) != SN_OK) {
        fprintf(stderr, "FAIL: %s: signature %s with key %s: %s\n", manifest, sigp, pubp, sn_errmsg());
        goto out;
    }
    if (sn_manifest_parse((const char *)text, len, manifest, &m) != SN_OK) {
        fprintf(stderr, "FAIL: signature valid but %s\n", sn_errmsg());
        goto out;
    }
    printf("OK: %s: ed25519 signature valid (%zu entries)\n", manifest, m->n);
    rc = 0;
out:
    sn_manifest_free(m);
    free(text);
    free(sig);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "keygen") == 0)
        return cmd_keygen(argc - 2, argv + 2);
    if (strcmp(cmd, "create") == 0)
        return cmd_create(argc - 2, argv + 2);
    if (strcmp(cmd, "sign") == 0)
        return cmd_sign(argc - 2, argv + 2);
    if (strcmp(cmd, "verify") == 0)
        return cmd_verify(argc - 2, argv + 2);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "sign_manifest: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
