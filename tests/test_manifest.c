/* Weight manifest gate: parser, SHA-256 streaming, ed25519 (RFC 8032 vector),
 * and the whole gate on a temporary model directory with every tampering
 * case the issue names. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "sanctum/manifest.h"

static void unhex(const char *h, unsigned char *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (unsigned char)v;
    }
}

static int write_file(const char *path, const void *data, size_t len, int mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0)
        return -1;
    const unsigned char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    fchmod(fd, mode);
    return close(fd);
}

static int flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return -1;
    unsigned char c;
    if (pread(fd, &c, 1, off) != 1) {
        close(fd);
        return -1;
    }
    c ^= 0x01;
    int r = pwrite(fd, &c, 1, off) == 1 ? 0 : -1;
    close(fd);
    return r;
}

/* RFC 8032 section 7.1, TEST 1: the empty message. */
static void test_rfc8032_test1(void)
{
    unsigned char seed[32], pub[32], want_pub[32], sig[64], want_sig[64];
    unhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", seed, 32);
    unhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", want_pub, 32);
    unhex("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f059"
          "5bbe24655141438e7a100b",
          want_sig, 64);
    CHECK_OK(sn_ed25519_public(seed, pub));
    CHECK(memcmp(pub, want_pub, 32) == 0);
    CHECK_OK(sn_ed25519_sign((const unsigned char *)"", 0, seed, sig));
    CHECK(memcmp(sig, want_sig, 64) == 0);
    CHECK_OK(sn_ed25519_verify((const unsigned char *)"", 0, want_sig, want_pub));
    /* One flipped bit anywhere in the signature, or one extra message byte, must fail. */
    want_sig[10] ^= 0x20;
    sn_status s = sn_ed25519_verify((const unsigned char *)"", 0, want_sig, want_pub);
    CHECK(s == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "OpenSSL") != NULL, "%s", sn_errmsg());
    want_sig[10] ^= 0x20;
    CHECK(sn_ed25519_verify((const unsigned char *)"x", 1, want_sig, want_pub) == SN_E_VERIFY);
}

static void test_sha256_known(void)
{
    char dir[] = "/tmp/sn_test_sha_XXXXXX", path[256];
    unsigned char d[32], want[32];
    uint64_t n = 0;
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/abc", dir);
    CHECK(write_file(path, "abc", 3, 0644) == 0);
    CHECK_OK(sn_sha256_file(path, d, &n));
    unhex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", want, 32);
    CHECK(memcmp(d, want, 32) == 0);
    CHECK(n == 3);
    /* empty file */
    CHECK(write_file(path, "", 0, 0644) == 0);
    CHECK_OK(sn_sha256_file(path, d, &n));
    unhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", want, 32);
    CHECK(memcmp(d, want, 32) == 0);
    unlink(path);
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(sn_sha256_file(path, d, &n) == SN_E_MISSING);
    rmdir(dir);
}

#define H64 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

static void test_parse_ok(void)
{
    const char *txt = H64 "  model.safetensors\n"
                          "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855 *./config.json\r\n"
                      H64 "  sub/dir/tokenizer.json";   /* no final newline */
    sn_manifest *m = NULL;
    CHECK_OK(sn_manifest_parse(txt, strlen(txt), "t", &m));
    CHECK(m && m->n == 3);
    if (m && m->n == 3) {
        CHECK(strcmp(m->entries[0].path, "model.safetensors") == 0);
        CHECK(strcmp(m->entries[1].path, "config.json") == 0);
        CHECK(strcmp(m->entries[2].path, "sub/dir/tokenizer.json") == 0);
        CHECK(m->entries[1].sha256[0] == 0xe3 && m->entries[1].line == 2);
        CHECK(m->entries[2].line == 3);
    }
    sn_manifest_free(m);
    sn_manifest_free(NULL);
}

static void expect_bad(const char *txt, const char *needle)
{
    sn_manifest *m = (sn_manifest *)1;
    sn_status s = sn_manifest_parse(txt, strlen(txt), "bad.manifest", &m);
    CHECKF(s == SN_E_FORMAT || s == SN_E_RANGE, "accepted: %s", txt);
    CHECK(m == NULL);
    CHECKF(strstr(sn_errmsg(), needle) != NULL, "message '%s' lacks '%s'", sn_errmsg(), needle);
    CHECKF(strstr(sn_errmsg(), "bad.manifest:") != NULL, "message '%s' lacks the file name", sn_errmsg());
}

static void test_parse_rejects(void)
{
    expect_bad(H64 "  /etc/passwd\n", "absolute path");
    expect_bad(H64 "  ../x.safetensors\n", "'..'");
    expect_bad(H64 "  a/../../x.safetensors\n", "'..'");
    expect_bad(H64 "  a/./b\n", "'.'");
    expect_bad(H64 "  a//b\n", "empty path component");
    expect_bad(H64 "  a/\n", "empty path component");
    expect_bad(H64 "  ./\n", "model directory itself");
    expect_bad(H64 "  \n", "empty path");
    expect_bad(H64 " x\n", "expected");
    expect_bad(H64 "x  model\n", "column 65");
    expect_bad("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85  model.safetensors\n", "hex");
    expect_bad("g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  m\n", "column 1");
    expect_bad(H64 "  a\n\n" H64 "  b\n", ":2: blank line");
    expect_bad("\\" H64 "  a\\nb\n", "escaped");
    expect_bad(H64 "  a\tb\n", "control character");
    expect_bad(H64 "  a\\b\n", "backslash");
    expect_bad(H64 "  a\n" H64 "  ./a\n", "duplicate entry for 'a'");
    expect_bad("", "no entries");
    char nul[80];
    memcpy(nul, H64 "  a\0b\n", 71);
    sn_manifest *m = NULL;
    CHECK(sn_manifest_parse(nul, 71, "n", &m) == SN_E_FORMAT && m == NULL);
    CHECK(strstr(sn_errmsg(), "NUL") != NULL);
}

static void test_weight_rule(void)
{
    CHECK(sn_manifest_is_weight_file("model.safetensors"));
    CHECK(sn_manifest_is_weight_file("model-00001-of-00002.safetensors"));
    CHECK(sn_manifest_is_weight_file("model.safetensors.index.json"));
    CHECK(sn_manifest_is_weight_file("config.json"));
    CHECK(sn_manifest_is_weight_file("draft/tokenizer.json"));
    CHECK(sn_manifest_is_weight_file("tokenizer_config.json"));
    CHECK(!sn_manifest_is_weight_file("README.md"));
    CHECK(!sn_manifest_is_weight_file("model.safetensors.bak"));
    CHECK(!sn_manifest_is_weight_file("myconfig.json.txt"));
}

/* --------------------------------------------------------- model directory */

typedef struct fixture {
    char root[64];
    char model[128];
    char manifest[160];
    char sig[160];
    char key[160];
    char pub[160];
    unsigned char seed[32];
} fixture;

static int fx_setup(fixture *f)
{
    char p[256];
    snprintf(f->root, sizeof f->root, "/tmp/sn_test_manifest_XXXXXX");
    if (!mkdtemp(f->root))
        return -1;
    snprintf(f->model, sizeof f->model, "%s/model", f->root);
    snprintf(f->manifest, sizeof f->manifest, "%s/manifest", f->root);
    snprintf(f->sig, sizeof f->sig, "%s/manifest.sig", f->root);
    snprintf(f->key, sizeof f->key, "%s/key", f->root);
    snprintf(f->pub, sizeof f->pub, "%s/key.pub", f->root);
    if (mkdir(f->model, 0755) != 0)
        return -1;
    snprintf(p, sizeof p, "%s/draft", f->model);
    if (mkdir(p, 0755) != 0)
        return -1;
    /* 3 MiB + 17 bytes: several reads of the 1 MiB buffer and a ragged tail. */
    size_t big = (3u << 20) + 17;
    unsigned char *w = malloc(big);
    if (!w)
        return -1;
    for (size_t i = 0; i < big; i++)
        w[i] = (unsigned char)(i * 2654435761u >> 13);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", f->model);
    int r = write_file(p, w, big, 0644);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", f->model);
    r |= write_file(p, w + 5, 100000, 0644);
    snprintf(p, sizeof p, "%s/draft/model.safetensors", f->model);
    r |= write_file(p, w + 9, 4096, 0644);
    free(w);
    snprintf(p, sizeof p, "%s/config.json", f->model);
    r |= write_file(p, "{\"model_type\":\"qwen2\"}\n", 23, 0644);
    snprintf(p, sizeof p, "%s/tokenizer.json", f->model);
    r |= write_file(p, "{}", 2, 0644);
    snprintf(p, sizeof p, "%s/README.md", f->model);   /* not a weight: need not be listed */
    r |= write_file(p, "hello", 5, 0644);
    if (r)
        return -1;
    char *text = NULL;
    size_t len = 0;
    if (sn_manifest_create(f->model, 3, &text, &len) != SN_OK)
        return -1;
    r = write_file(f->manifest, text, len, 0644);
    free(text);
    if (r || RAND_bytes(f->seed, 32) != 1 || write_file(f->key, f->seed, 32, 0600))
        return -1;
    unsigned char pub[32], sig[64], *mb = NULL;
    size_t ml = 0;
    if (sn_ed25519_public(f->seed, pub) != SN_OK || write_file(f->pub, pub, 32, 0644))
        return -1;
    if (sn_manifest_read_file(f->manifest, SN_MANIFEST_MAX_BYTES, &mb, &ml) != SN_OK)
        return -1;
    r = sn_ed25519_sign(mb, ml, f->seed, sig) == SN_OK ? write_file(f->sig, sig, 64, 0644) : -1;
    free(mb);
    return r;
}

static void fx_teardown(fixture *f)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->root);
    if (strncmp(f->root, "/tmp/sn_test_manifest_", 22) == 0 && system(cmd) != 0)
        fprintf(stderr, "  could not remove %s\n", f->root);
}

/* A fixture that cannot be built fails the test, which stops there (like
 * SKIP, it returns from the test function). */
#define FX_SETUP_OR_RETURN(f)                                                                          \
    do {                                                                                               \
        if (fx_setup(f) != 0) {                                                                        \
            CHECK(!"fixture setup");                                                                   \
            fx_teardown(f);                                                                            \
            return;                                                                                    \
        }                                                                                              \
    } while (0)

static sn_status fx_gate(fixture *f, int signed_, sn_manifest_report *rep)
{
    sn_manifest_opts o = { .manifest_path = f->manifest, .quiet = 1, .n_threads = 4 };
    if (signed_) {
        o.pubkey_path = f->pub;
        o.sig_path = f->sig;
    }
    return sn_manifest_gate(f->model, &o, rep);
}

static void test_gate_round_trip(void)
{
    fixture f;
    FX_SETUP_OR_RETURN(&f);
    sn_manifest_report rep;
    CHECK_OK(fx_gate(&f, 1, &rep));
    CHECK(rep.signature_checked == 1);
    CHECK(rep.n_files == 5);
    CHECK(rep.bytes == (3u << 20) + 17 + 100000 + 4096 + 23 + 2);
    CHECK(rep.seconds >= rep.hash_seconds && rep.seconds >= 0);
    /* default signature path "<manifest>.sig" */
    sn_manifest_opts o = { .manifest_path = f.manifest, .pubkey_path = f.pub, .quiet = 1, .require_signed = 1 };
    CHECK_OK(sn_manifest_gate(f.model, &o, &rep));
    CHECK(rep.signature_checked == 1);
    /* one thread gives the same verdict */
    o.n_threads = 1;
    CHECK_OK(sn_manifest_gate(f.model, &o, NULL));
    /* unsigned without --require-signed-manifest: accepted, flagged */
    CHECK_OK(fx_gate(&f, 0, &rep));
    CHECK(rep.signature_checked == 0);
    /* unsigned with --require-signed-manifest: fatal */
    sn_manifest_opts u = { .manifest_path = f.manifest, .quiet = 1, .require_signed = 1 };
    CHECK(sn_manifest_gate(f.model, &u, NULL) == SN_E_VERIFY);
    CHECK(strstr(sn_errmsg(), "unsigned") != NULL);
    /* a signature without a key is a configuration error */
    sn_manifest_opts s = { .manifest_path = f.manifest, .sig_path = f.sig, .quiet = 1 };
    CHECK(sn_manifest_gate(f.model, &s, NULL) == SN_E_INVALID);
    fx_teardown(&f);
}

static void test_gate_flipped_weight(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", f.model);
    CHECK(flip_byte(p, (2 << 20) + 5) == 0);   /* in the third buffer-full */
    sn_status s = fx_gate(&f, 1, NULL);
    CHECK(s == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "model-00001-of-00002.safetensors") && strstr(sn_errmsg(), "mismatch"), "%s",
           sn_errmsg());
    fx_teardown(&f);
}

static void test_gate_flipped_manifest(void)
{
    fixture f;
    FX_SETUP_OR_RETURN(&f);
    CHECK(flip_byte(f.manifest, 3) == 0);   /* inside the first hash */
    sn_status s = fx_gate(&f, 1, NULL);
    CHECK(s == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), f.manifest) && strstr(sn_errmsg(), "signature") && strstr(sn_errmsg(), "OpenSSL"),
           "%s", sn_errmsg());
    /* the same tampered manifest, unsigned: the hash now mismatches */
    s = fx_gate(&f, 0, NULL);
    CHECK(s == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "mismatch") != NULL, "%s", sn_errmsg());
    fx_teardown(&f);
}

static void test_gate_flipped_signature(void)
{
    fixture f;
    FX_SETUP_OR_RETURN(&f);
    CHECK(flip_byte(f.sig, 40) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), f.sig) && strstr(sn_errmsg(), "does not verify"), "%s", sn_errmsg());
    /* truncated signature */
    CHECK(truncate(f.sig, 63) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "63 bytes") != NULL, "%s", sn_errmsg());
    /* missing signature */
    unlink(f.sig);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), f.sig) != NULL, "%s", sn_errmsg());
    fx_teardown(&f);
}

static void test_gate_wrong_key(void)
{
    fixture f;
    FX_SETUP_OR_RETURN(&f);
    unsigned char seed[32], pub[32];
    CHECK(RAND_bytes(seed, 32) == 1);
    CHECK_OK(sn_ed25519_public(seed, pub));
    CHECK(write_file(f.pub, pub, 32, 0644) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    /* a public key of the wrong size */
    CHECK(write_file(f.pub, pub, 31, 0644) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_FORMAT);
    CHECKF(strstr(sn_errmsg(), f.pub) != NULL, "%s", sn_errmsg());
    fx_teardown(&f);
}

static void test_gate_missing_file(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f);
    /* A listed non-weight file that vanished: only hashing can notice. */
    FILE *mf = fopen(f.manifest, "a");
    CHECK(mf != NULL);
    if (mf) {
        fprintf(mf, H64 "  extra/notes.txt\n");
        fclose(mf);
    }
    sn_status s = fx_gate(&f, 0, NULL);
    CHECK(s == SN_E_MISSING);
    CHECKF(strstr(sn_errmsg(), "extra/notes.txt") && strstr(sn_errmsg(), "missing"), "%s", sn_errmsg());
    /* a listed weight shard deleted */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", f.model);
    CHECK(unlink(p) == 0);
    s = fx_gate(&f, 0, NULL);
    CHECK(s == SN_E_MISSING);
    fx_teardown(&f);
}

static void test_gate_unlisted_weight(void)
{
    fixture f;
    char p[256];
    FX_SETUP_OR_RETURN(&f);
    snprintf(p, sizeof p, "%s/draft/extra.safetensors", f.model);
    CHECK(write_file(p, "x", 1, 0644) == 0);
    sn_status s = fx_gate(&f, 1, NULL);
    CHECK(s == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "draft/extra.safetensors") && strstr(sn_errmsg(), "not listed"), "%s",
           sn_errmsg());
    unlink(p);
    snprintf(p, sizeof p, "%s/generation_config.json", f.model);
    CHECK(write_file(p, "{}", 2, 0644) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "generation_config.json") != NULL, "%s", sn_errmsg());
    fx_teardown(&f);
}

/* The manifest may come straight from coreutils sha256sum (text and binary mode). */
static void test_gate_coreutils_format(void)
{
    fixture f;
    char cmd[1024];
    FX_SETUP_OR_RETURN(&f);
    if (system("command -v sha256sum >/dev/null 2>&1") != 0) {
        fx_teardown(&f);
        SKIP("sha256sum not installed");
    }
    snprintf(cmd, sizeof cmd,
             "cd '%s' && sha256sum -b model-0000*.safetensors config.json > '%s' && "
             "sha256sum ./tokenizer.json draft/model.safetensors >> '%s'",
             f.model, f.manifest, f.manifest);
    CHECK(system(cmd) == 0);
    CHECK_OK(fx_gate(&f, 0, NULL));
    fx_teardown(&f);
}

/* The Hugging Face cache layout: weights are symlinks into ../blobs. The
 * hash covers the target; a dangling weight link must still be accounted
 * for; a listed directory is refused. */
static void test_gate_symlinks(void)
{
    fixture f;
    char p[256], blob[256];
    FX_SETUP_OR_RETURN(&f);
    snprintf(blob, sizeof blob, "%s/blob-config", f.root);
    snprintf(p, sizeof p, "%s/config.json", f.model);
    CHECK(rename(p, blob) == 0);
    CHECK(symlink(blob, p) == 0);
    CHECK_OK(fx_gate(&f, 1, NULL));   /* same bytes through the link */
    CHECK(write_file(blob, "{\"model_type\":\"evil\"}\n", 22, 0644) == 0);
    CHECK(fx_gate(&f, 1, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "config.json") && strstr(sn_errmsg(), "mismatch"), "%s", sn_errmsg());
    unlink(blob);   /* now dangling: listed, so it is reported missing */
    CHECK(fx_gate(&f, 1, NULL) == SN_E_MISSING);
    CHECKF(strstr(sn_errmsg(), "config.json") != NULL, "%s", sn_errmsg());
    snprintf(p, sizeof p, "%s/draft/x.safetensors", f.model);
    CHECK(symlink("/nonexistent/x", p) == 0);   /* dangling and unlisted */
    CHECK(fx_gate(&f, 0, NULL) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "draft/x.safetensors") && strstr(sn_errmsg(), "not listed"), "%s", sn_errmsg());
    fx_teardown(&f);

    /* a listed path that is a directory */
    const char *txt = H64 "  draft\n";
    sn_manifest *m = NULL;
    CHECK_OK(sn_manifest_parse(txt, strlen(txt), "dir", &m));
    if (fx_setup(&f) == 0 && m) {
        CHECK(sn_manifest_verify_dir(m, f.model, 2, NULL) == SN_E_VERIFY);   /* real weights unlisted first */
        snprintf(p, sizeof p, "%s/lonely", f.root);
        CHECK(mkdir(p, 0755) == 0);
        snprintf(blob, sizeof blob, "%s/lonely/draft", f.root);
        CHECK(mkdir(blob, 0755) == 0);
        CHECK(sn_manifest_verify_dir(m, p, 2, NULL) == SN_E_INVALID);
        CHECKF(strstr(sn_errmsg(), "not a regular file") != NULL, "%s", sn_errmsg());
    }
    sn_manifest_free(m);
    fx_teardown(&f);
}

/* Pins: the loader's fd must be the file the gate hashed, unchanged. */
static void test_gate_pins(void)
{
    fixture f;
    char p[256], q[256];
    FX_SETUP_OR_RETURN(&f);
    sn_manifest_opts o = { .manifest_path = f.manifest, .pubkey_path = f.pub, .quiet = 1 };
    sn_manifest_pins *pins = NULL;
    CHECK(sn_manifest_gate_pinned(f.model, &o, NULL, NULL) == SN_E_INVALID);
    CHECK_OK(sn_manifest_gate_pinned(f.model, &o, NULL, &pins));
    CHECK(pins != NULL);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", f.model);
    int fd = open(p, O_RDONLY);
    CHECK_OK(sn_manifest_pins_check_fd(pins, "model-00001-of-00002.safetensors", fd));
    CHECK_OK(sn_manifest_pins_check_fd(pins, "./model-00001-of-00002.safetensors", fd));
    /* the right fd under the wrong name */
    CHECK(sn_manifest_pins_check_fd(pins, "config.json", fd) == SN_E_VERIFY);
    CHECK(sn_manifest_pins_check_fd(pins, "README.md", fd) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "README.md: not verified") != NULL, "%s", sn_errmsg());
    CHECK(sn_manifest_pins_check_fd(pins, "../x", fd) == SN_E_INVALID);
    /* written to after the gate (same inode): refused */
    usleep(20 * 1000);   /* file timestamps tick coarsely */
    CHECK(flip_byte(p, 7) == 0);
    CHECK(flip_byte(p, 7) == 0);   /* content back as it was: only the state changed */
    CHECK(sn_manifest_pins_check_fd(pins, "model-00001-of-00002.safetensors", fd) == SN_E_VERIFY);
    CHECKF(strstr(sn_errmsg(), "model file model-00001-of-00002.safetensors changed after the manifest was verified") != NULL, "%s", sn_errmsg());
    close(fd);
    /* replaced by rename with identical bytes (new inode): refused */
    snprintf(p, sizeof p, "%s/config.json", f.model);
    snprintf(q, sizeof q, "%s/config.json.new", f.root);
    CHECK(write_file(q, "{\"model_type\":\"qwen2\"}\n", 23, 0644) == 0);
    CHECK(rename(q, p) == 0);
    fd = open(p, O_RDONLY);
    CHECK(sn_manifest_pins_check_fd(pins, "config.json", fd) == SN_E_VERIFY);
    close(fd);
    /* an untouched file still passes */
    snprintf(p, sizeof p, "%s/tokenizer.json", f.model);
    fd = open(p, O_RDONLY);
    CHECK_OK(sn_manifest_pins_check_fd(pins, "tokenizer.json", fd));
    close(fd);
    sn_manifest_pins_free(pins);
    sn_manifest_pins_free(NULL);
    /* a failing gate leaves no pins */
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", f.model);
    CHECK(flip_byte(p, 3) == 0);
    pins = (sn_manifest_pins *)&o;
    CHECK(sn_manifest_gate_pinned(f.model, &o, NULL, &pins) == SN_E_VERIFY);
    CHECK(pins == NULL);
    fx_teardown(&f);
}

static void test_private_key_perms(void)
{
    fixture f;
    unsigned char seed[32];
    FX_SETUP_OR_RETURN(&f);
    CHECK_OK(sn_ed25519_load_private(f.key, seed));
    CHECK(memcmp(seed, f.seed, 32) == 0);
    CHECK(chmod(f.key, 0640) == 0);
    CHECK(sn_ed25519_load_private(f.key, seed) == SN_E_INVALID);
    CHECKF(strstr(sn_errmsg(), "chmod 600") != NULL, "%s", sn_errmsg());
    fx_teardown(&f);
}

int main(void)
{
    RUN(test_rfc8032_test1);
    RUN(test_sha256_known);
    RUN(test_parse_ok);
    RUN(test_parse_rejects);
    RUN(test_weight_rule);
    RUN(test_gate_round_trip);
    RUN(test_gate_flipped_weight);
    RUN(test_gate_flipped_manifest);
    RUN(test_gate_flipped_signature);
    RUN(test_gate_wrong_key);
    RUN(test_gate_missing_file);
    RUN(test_gate_unlisted_weight);
    RUN(test_gate_coreutils_format);
    RUN(test_gate_symlinks);
    RUN(test_gate_pins);
    RUN(test_private_key_perms);
    return TEST_END();
}
