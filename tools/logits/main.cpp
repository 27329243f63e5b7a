// llama-sparse-logits: teacher-forced decode that writes every step's full logits vector.
//
// The identity and logits gates need logits, bit for bit, from the decode path (one token
// per micro-batch, where the sparse methods act), for two builds or two flag sets fed the
// same token stream. The server only exposes top-n probabilities after softmax, so this
// small tool, built by our CMakeLists.txt against whichever tree is being built, does it:
//
//   llama-sparse-logits -m MODEL -f PROMPT.txt -c N [any llama.cpp flag] \
//       --dump-steps S --dump-out OUT.bin [--dump-force TOKENS.bin] [--dump-prompt-tokens P]
//
// It cuts the tokenized prompt to its first P tokens when given (so the caller can ask for an
// exact depth with any tokenizer), prefills it, then decodes S tokens one at a time: the tokens of TOKENS.bin
// (int32) when given, else its own greedy choice. OUT.bin is a header
// {"LSLG", int32 version=1, int32 n_vocab, int32 n_prompt, int32 n_rows} followed by n_rows
// records {int32 next_token, float32 logits[n_vocab]}: row 0 is the prefill's last position,
// row i the decode step that consumed the i-th token of the stream.

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "log.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static void usage(int, char ** argv) {
    fprintf(stderr, "usage: %s -m MODEL -f PROMPT -c N --dump-steps S --dump-out FILE [--dump-force FILE] [llama.cpp flags]\n", argv[0]);
}

int main(int argc, char ** argv) {
    int n_steps = -1;
    int n_prompt_max = -1;
    std::string out_path, force_path;
    std::vector<char *> rest = {argv[0]};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if ((a == "--dump-steps" || a == "--dump-out" || a == "--dump-force" || a == "--dump-prompt-tokens") && i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value\n", a.c_str());
            return 2;
        }
        if (a == "--dump-steps") { n_steps = std::atoi(argv[++i]); }
        else if (a == "--dump-out") { out_path = argv[++i]; }
        else if (a == "--dump-force") { force_path = argv[++i]; }
        else if (a == "--dump-prompt-tokens") { n_prompt_max = std::atoi(argv[++i]); }
        else { rest.push_back(argv[i]); }
    }
    if (n_steps < 0 || out_path.empty()) {
        usage(argc, argv);
        return 2;
    }

    common_params params;
    if (!common_params_parse((int) rest.size(), rest.data(), params, LLAMA_EXAMPLE_COMMON, usage)) {
        return 2;
    }
    common_init();
    llama_backend_init();

    std::vector<llama_token> forced;
    if (!force_path.empty()) {
        FILE * f = fopen(force_path.c_str(), "rb");
        if (!f) { fprintf(stderr, "error: cannot open %s\n", force_path.c_str()); return 2; }
        llama_token t;
        while (fread(&t, sizeof(t), 1, f) == 1) { forced.push_back(t); }
        fclose(f);
        if ((int) forced.size() < n_steps) {
            fprintf(stderr, "error: %s holds %zu tokens, fewer than --dump-steps %d\n", force_path.c_str(), forced.size(), n_steps);
            return 2;
        }
    }

    auto init = common_init_from_params(params);
    llama_context * ctx = init->context();
    llama_model * model = init->model();
    if (!ctx || !model) {
        common_log_flush(common_log_main()); // the reason is in the log: let it out before exiting
        fprintf(stderr, "error: failed to load the model\n");
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> prompt = common_tokenize(ctx, params.prompt, true, true);
    if (n_prompt_max > 0 && (int) prompt.size() > n_prompt_max) {
        prompt.resize(n_prompt_max);
    }
    if (prompt.empty()) { fprintf(stderr, "error: empty prompt\n"); return 2; }
    if ((int) prompt.size() + n_steps > (int) llama_n_ctx(ctx)) {
        fprintf(stderr, "error: prompt (%zu) + steps (%d) exceed the context (%u)\n", prompt.size(), n_steps, llama_n_ctx(ctx));
        return 2;
    }

    FILE * out = fopen(out_path.c_str(), "wb");
    if (!out) { fprintf(stderr, "error: cannot write %s\n", out_path.c_str()); return 2; }
    const int32_t header[5] = {0x474c534c /* "LSLG" */, 1, n_vocab, (int32_t) prompt.size(), n_steps + 1};
    fwrite(header, sizeof(header), 1, out);

    const int n_batch = (int) llama_n_batch(ctx);
    for (size_t i = 0; i < prompt.size(); i += n_batch) {
        const int n = std::min<int>(n_batch, (int) (prompt.size() - i));
        if (llama_decode(ctx, llama_batch_get_one(prompt.data() + i, n)) != 0) {
            fprintf(stderr, "error: prefill failed at token %zu\n", i);
            return 1;
        }
    }
    for (int step = 0; step <= n_steps; step++) {
        const float * logits = llama_get_logits_ith(ctx, -1);
        llama_token next = 0;
        if (step < n_steps && !forced.empty()) {
            next = forced[step];
        } else {
            for (int v = 1; v < n_vocab; v++) { if (logits[v] > logits[next]) { next = v; } }
        }
        fwrite(&next, sizeof(next), 1, out);
        fwrite(logits, sizeof(float), n_vocab, out);
        if (step == n_steps) { break; }
        if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
            fprintf(stderr, "error: decode failed at step %d\n", step);
            return 1;
        }
    }
    fclose(out);
    fprintf(stderr, "wrote %d rows of %d logits (prompt %zu tokens) to %s\n", n_steps + 1, n_vocab, prompt.size(), out_path.c_str());
#ifdef LLAMA_SPARSE_API_VERSION   // the patched tree (common.h includes llama-sparse.h); this tool is built against upstream's too
    llama_sparse_stats st;
    const bool have_stats = llama_sparse_get_stats(ctx, -1, &st, false) && st.sparse_attn != LLAMA_SPARSE_ATTN_OFF;
    if (have_stats && st.method == LLAMA_SPARSE_METHOD_BLOCK) {
        fprintf(stderr, "block: read %llu of %llu visible blocks\n", (unsigned long long) st.blocks_read,
                (unsigned long long) st.blocks_visible);
#if LLAMA_SPARSE_API_VERSION >= 7
        fprintf(stderr, "block: %llu of %llu sparse decode steps computed again densely\n", (unsigned long long) st.steps_rechecked,
                (unsigned long long) st.steps_sparse);
#endif
    }
    if (have_stats && st.method == LLAMA_SPARSE_METHOD_SCSA) {
        // what SCSA did over the run, for the gates and tests that read this log
        fprintf(stderr, "scsa: calls %lld, read %lld of %lld visible rows (opened %lld, exact %lld), rebuilds %lld, "
                        "exact calls %lld, calibration %d steps, %s\n",
                (long long) st.scsa_calls, (long long) (st.scsa_opened_rows + st.scsa_exact_rows), (long long) st.scsa_visible_rows,
                (long long) st.scsa_opened_rows, (long long) st.scsa_exact_rows, (long long) st.scsa_rebuilds,
                (long long) st.scsa_dense_calls, st.scsa_calib_steps, st.scsa_calibrated ? "taus frozen" : "calibrating");
    }
#endif
    common_log_flush(common_log_main());
    llama_backend_free();
    return 0;
}
