/* Embedding moestream from C: load a model, stream a completion (stopping it from the callback),
 * chat through the model's template in a session (the second turn reuses the first's KV cache),
 * score a sentence, and show errors.
 *
 *   cc examples/c/generate.c -Iinclude -Ltarget/release -lmoestream_c -Wl,-rpath,target/release -o generate
 *   ./generate models/moestream-tiny-moe
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moestream.h"

/* Prints each piece as it arrives; stops after `limit` tokens (a UI's "stop" button). */
struct stream {
    unsigned seen;
    unsigned limit;
};

static bool on_token(void *user_data, uint32_t token, const char *text, size_t len) {
    struct stream *s = user_data;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    s->seen++;
    return s->seen < s->limit;
}

static int fail(const char *what) {
    const char *err = moestream_last_error();
    fprintf(stderr, "%s failed: %s\n", what, err ? err : "(no message)");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
        return 2;
    }
    printf("moestream %s\n", moestream_version());

    MoestreamLoadOptions load;
    moestream_load_options_default(&load);
    load.model_dir = "/nonexistent/model";
    if (moestream_engine_load(&load) != NULL) return 1;
    printf("bad model dir: %s\n", moestream_last_error());

    load.model_dir = argv[1];
    load.context = 512;
    MoestreamEngine *engine = moestream_engine_load(&load);
    if (!engine) return fail("moestream_engine_load");

    MoestreamGenerateOptions options;
    moestream_generate_options_default(&options);
    options.max_tokens = 24;

    /* 1. A completion streamed token by token, cancelled by the callback after 8 tokens. */
    struct stream s = {0, 8};
    MoestreamStats stats = {.struct_size = sizeof stats};
    printf("completion: The jury said");
    char *text = moestream_generate(engine, NULL, "The jury said", &options, on_token, &s, &stats);
    if (!text) return fail("moestream_generate");
    printf("\n[%u prompt tokens, %u generated at %.1f tok/s, cancelled=%d]\n", stats.prompt_tokens,
           stats.generated_tokens, stats.decode_tokens_per_s, stats.cancelled);
    moestream_string_free(text);

    /* 2. Two chat turns through the model's chat template, in one session. */
    MoestreamSession *session = moestream_session_new(engine);
    if (!session) return fail("moestream_session_new");
    s.seen = 0;
    s.limit = 1000;
    printf("chat: ");
    const char *turn1 = "[{\"role\": \"system\", \"content\": \"Answer briefly.\"},"
                        " {\"role\": \"user\", \"content\": \"Where is the city hall?\"}]";
    char *reply = moestream_chat(engine, session, turn1, &options, on_token, &s, &stats);
    if (!reply) return fail("moestream_chat");
    printf("\n[reply of %zu bytes, %u tokens]\n", strlen(reply), stats.generated_tokens);

    /* The next turn repeats the conversation (as chat APIs do); the session prefills only the new part. */
    char turn2[4096];
    char *quoted = reply; /* the tiny model's text: escape quotes and newlines for JSON */
    char escaped[2048];
    size_t k = 0;
    for (; *quoted && k + 2 < sizeof escaped; quoted++) {
        if (*quoted == '"' || *quoted == '\\') escaped[k++] = '\\';
        if (*quoted == '\n') { escaped[k++] = '\\'; escaped[k++] = 'n'; continue; }
        if ((unsigned char)*quoted < 0x20) { escaped[k++] = ' '; continue; }
        escaped[k++] = *quoted;
    }
    escaped[k] = 0;
    snprintf(turn2, sizeof turn2,
             "[{\"role\": \"system\", \"content\": \"Answer briefly.\"},"
             " {\"role\": \"user\", \"content\": \"Where is the city hall?\"},"
             " {\"role\": \"assistant\", \"content\": \"%s\"},"
             " {\"role\": \"user\", \"content\": \"And the library?\"}]",
             escaped);
    moestream_string_free(reply);
    printf("chat: ");
    reply = moestream_chat(engine, session, turn2, &options, on_token, &s, &stats);
    if (!reply) return fail("moestream_chat");
    printf("\n[turn 2: %u prompt tokens, %u reused from the session]\n", stats.prompt_tokens, stats.reused_tokens);
    moestream_string_free(reply);
    moestream_session_free(session);

    /* 3. Perplexity of a sentence. */
    uint32_t tokens[64];
    int64_t n = moestream_tokenize(engine, "The committee approved the new budget.", tokens, 64);
    if (n < 2 || n > 64) return fail("moestream_tokenize");
    float logprobs[64];
    double perplexity = 0.0;
    if (moestream_score(engine, tokens, (size_t)n, logprobs, &perplexity) != 0) return fail("moestream_score");
    printf("score: %lld tokens, perplexity %.2f\n", (long long)n, perplexity);

    /* 4. Errors are values, never crashes. */
    if (moestream_chat(engine, NULL, "not json", &options, NULL, NULL, NULL) != NULL) return 1;
    printf("bad messages: %s\n", moestream_last_error());

    moestream_engine_free(engine);
    printf("ok\n");
    return 0;
}
