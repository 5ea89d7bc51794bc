/* sanctum-tok: the tokenizer and chat templates from the command line.
 *
 *   sanctum-tok MODEL encode [--plain] [TEXT]   ids of TEXT (or stdin); --plain: special
 *                                               tokens written in the text stay text
 *   sanctum-tok MODEL decode ID...              text of the ids (special tokens shown)
 *   sanctum-tok MODEL count [FILE]              number of tokens of FILE (or stdin) and speed
 *   sanctum-tok MODEL chat [--think] [--ids] REQUEST.json
 *                                               the prompt for an OpenAI-style request
 *                                               {"messages": [...], "tools": [...]}:
 *                                               text, or with --ids the guarded ids
 *
 * MODEL is a model directory (config.json gives model_type; tekken.json is
 * preferred over tokenizer.json) or a tokenizer file. Exit status 0 on
 * success, 1 on a failure (the message names what went wrong). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sanctum/chat.h"
#include "sanctum/tokenizer.h"

static int usage(void)
{
    fprintf(stderr, "usage: sanctum-tok MODEL encode [--plain] [TEXT]\n"
                    "       sanctum-tok MODEL decode ID...\n"
                    "       sanctum-tok MODEL count [FILE]\n"
                    "       sanctum-tok MODEL chat [--think] [--ids] REQUEST.json\n");
    return 2;
}

static int fail(const char *what)
{
    fprintf(stderr, "sanctum-tok: %s: %s\n", what, sn_errmsg());
    return 1;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        char *p = realloc(b, cap * 2 + 1);
        if (!p) { free(b); return NULL; }
        b = p;
        cap *= 2;
    }
    if (b) b[n] = 0;
    *len = n;
    return b;
}

/* model_type from MODEL/config.json when MODEL is a directory (text_config too). */
static char *model_type_of(const char *model)
{
    struct stat st;
    if (stat(model, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model);
    json_error_t e;
    json_t *c = json_load_file(path, 0, &e);
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    char *r = mt ? strdup(mt) : NULL;
    json_decref(c);
    return r;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmd_chat(const sn_tokenizer *t, const char *mt, int argc, char **argv)
{
    bool think = false, ids_out = false;
    const char *req_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--think")) think = true;
        else if (!strcmp(argv[i], "--ids")) ids_out = true;
        else req_path = argv[i];
    }
    if (!req_path) return usage();
    if (!mt) { fprintf(stderr, "sanctum-tok: chat needs a model directory with config.json (model_type)\n"); return 1; }
    sn_chat_format f;
    if (sn_chat_format_for(mt, &f) != SN_OK) return fail("chat template");
    json_error_t e;
    json_t *req = json_load_file(req_path, 0, &e);
    if (!req) { fprintf(stderr, "sanctum-tok: %s: %s (line %d)\n", req_path, e.text, e.line); return 1; }
    json_t *jm = json_object_get(req, "messages");
    size_t n = json_array_size(jm), n_calls = 0;
    for (size_t i = 0; i < n; i++) n_calls += json_array_size(json_object_get(json_array_get(jm, i), "tool_calls"));
    sn_chat_msg *msgs = calloc(n ? n : 1, sizeof *msgs);
    sn_chat_tool_call *calls = calloc(n_calls ? n_calls : 1, sizeof *calls);
    char **args = calloc(n_calls ? n_calls : 1, sizeof *args);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(jm, i), *tc = json_object_get(m, "tool_calls");
        msgs[i].role = json_string_value(json_object_get(m, "role"));
        msgs[i].content = json_string_value(json_object_get(m, "content"));
        msgs[i].reasoning = json_string_value(json_object_get(m, "reasoning_content"));
        msgs[i].tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
        msgs[i].tool_calls = calls + k;
        msgs[i].n_tool_calls = json_array_size(tc);
        for (size_t q = 0; q < json_array_size(tc); q++, k++) {
            json_t *c = json_array_get(tc, q), *fn = json_object_get(c, "function");
            json_t *a = json_object_get(fn, "arguments");
            calls[k].id = json_string_value(json_object_get(c, "id"));
            calls[k].name = json_string_value(json_object_get(fn, "name"));
            /* OpenAI sends arguments as a JSON string; accept an object too */
            calls[k].arguments = json_is_string(a) ? json_string_value(a)
                                                   : (args[k] = a ? json_dumps(a, JSON_ENCODE_ANY) : NULL);
        }
    }
    json_t *jt = json_object_get(req, "tools");
    char *tools = jt && !json_is_null(jt) ? json_dumps(jt, 0) : NULL;
    sn_chat_opts o = { .add_generation_prompt = true, .enable_thinking = think, .tools = tools };
    int rc = 0;
    if (ids_out) {
        sn_ids ids = {0};
        if (sn_chat_encode(t, f, msgs, n, &o, &ids) != SN_OK) rc = fail("chat");
        for (size_t i = 0; i < ids.n; i++) printf("%d%c", ids.ids[i], i + 1 < ids.n ? ' ' : '\n');
        sn_ids_free(&ids);
    } else {
        char *text = NULL;
        if (sn_chat_render(f, msgs, n, &o, &text) != SN_OK) rc = fail("chat");
        else fputs(text, stdout);
        free(text);
    }
    for (size_t i = 0; i < n_calls; i++) free(args[i]);
    free(args);
    free(calls);
    free(msgs);
    free(tools);
    json_decref(req);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) return usage();
    const char *model = argv[1], *cmd = argv[2];
    char *mt = model_type_of(model);
    sn_tokenizer *t = NULL;
    if (sn_tok_load(model, mt, &t) != SN_OK) { free(mt); return fail("loading the tokenizer"); }
    int rc = 0;
    if (!strcmp(cmd, "encode")) {
        bool plain = argc > 3 && !strcmp(argv[3], "--plain");
        int ai = 3 + plain;
        size_t len = 0;
        char *text = ai < argc ? strdup(argv[ai]) : read_all(stdin, &len);
        if (ai < argc && text) len = strlen(text);
        sn_ids ids = {0};
        if (!text) rc = fail("reading the text");
        else if (sn_tok_encode(t, text, len, !plain, &ids) != SN_OK) rc = fail("encoding");
        else
            for (size_t i = 0; i < ids.n; i++) printf("%d%c", ids.ids[i], i + 1 < ids.n ? ' ' : '\n');
        sn_ids_free(&ids);
        free(text);
    } else if (!strcmp(cmd, "decode")) {
        int n = argc - 3;
        int32_t *ids = calloc(n > 0 ? (size_t)n : 1, sizeof *ids);
        for (int i = 0; i < n; i++) {
            char *end;
            long v = strtol(argv[3 + i], &end, 10);
            if (*end || v < INT32_MIN || v > INT32_MAX) { fprintf(stderr, "sanctum-tok: bad id \"%s\"\n", argv[3 + i]); rc = 1; }
            ids[i] = (int32_t)v;
        }
        char *text = NULL;
        if (!rc && sn_tok_decode(t, ids, (size_t)n, false, &text, NULL) != SN_OK) rc = fail("decoding");
        else if (!rc) printf("%s\n", text);
        free(text);
        free(ids);
    } else if (!strcmp(cmd, "count")) {
        FILE *f = argc > 3 ? fopen(argv[3], "rb") : stdin;
        size_t len = 0;
        char *text = f ? read_all(f, &len) : NULL;
        if (f && f != stdin) fclose(f);
        sn_ids ids = {0};
        double t0 = now_s();
        if (!text) { fprintf(stderr, "sanctum-tok: cannot read %s\n", argc > 3 ? argv[3] : "stdin"); rc = 1; }
        else if (sn_tok_encode(t, text, len, false, &ids) != SN_OK) rc = fail("encoding");
        else printf("%zu tokens, %zu bytes, %.1f MB/s\n", ids.n, len, len / 1048576.0 / (now_s() - t0 + 1e-9));
        sn_ids_free(&ids);
        free(text);
    } else if (!strcmp(cmd, "chat")) {
        rc = cmd_chat(t, mt, argc - 3, argv + 3);
    } else {
        rc = usage();
    }
    sn_tok_free(t);
    free(mt);
    return rc;
}
