// llama-sparse-cachecheck: the KV cache life cycle with sparse attention, step by step.
//
// The block method's key bounds and SCSA's plans are second copies of what the KV cache holds,
// so every operation that changes the cache without going through a decode (prompt-cache reuse,
// sequence removal, context shift, slot save and restore, keeping one sequence, copying one)
// could leave them stale. This tool runs each of those operations the way llama-server does,
// teacher-forced on a fixed text so that two runs see the same tokens, and prints one JSON object:
//
//   {"n_ctx": N, "context_bytes": N, "scenarios": [{"name": ..., "steps": ["<fnv64 of the logits bytes>", ...],
//                   "argmax": [...], "checks": [{"after": ..., "blocks": N, "loose": N, "short": N}],
//                   "plan_checks": [{"after": ..., "rows": N, "stale": N}]}]}
//
// Two runs compared step by step tell whether the logits are bit-identical (dense against a
// select-all sparse run) or, with --cc-logits FILE (every step's logits appended as float32),
// how close; the checks (block method) count blocks whose bounds hold a key no cell holds
// (loose: stale) or miss a key a cell holds (short: unsound); the plan checks (SCSA) count
// planned rows whose cell is gone or whose packed copy is not the cache's row: all must stay 0.
//
// The two sequences share one unified KV cache, as llama-server's automatic slots do; with
// --cc-kv-per-seq each has a stream of its own (--parallel N with a cache per slot, as SCSA
// serves several slots), and the batched scenario then decodes both in every micro-batch.
//
//   llama-sparse-cachecheck -m MODEL -f TEXT.txt -c N [llama.cpp flags] [--cc-prompt-tokens P] [--cc-steps K]
//                           [--cc-kv-per-seq] [--cc-logits FILE]

#include "arg.h"
#include "common.h"
#include "llama.h"
#include "llama-ext.h" // llama_get_memory_breakdown

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct runner {
    llama_context * ctx;
    llama_memory_t  mem;
    int             n_vocab;
    int             n_batch;
    FILE *          logits_out; // every step's logits, or nullptr
    std::vector<std::string> steps, checks, plan_checks;
    std::vector<llama_token> argmax;

    static uint64_t fnv64(const float * x, size_t n) {
        uint64_t h = 1469598103934665603ULL;
        const auto * p = reinterpret_cast<const uint8_t *>(x);
        for (size_t i = 0; i < n*sizeof(float); ++i) {
            h = (h ^ p[i]) * 1099511628211ULL;
        }
        return h;
    }

    // decode tokens of seq at positions pos0.., in n_batch chunks; logits of the last one only
    void feed(llama_seq_id seq, const llama_token * toks, int n, llama_pos pos0) {
        llama_batch batch = llama_batch_init(n_batch, 0, 1);
        for (int i = 0; i < n; i += n_batch) {
            const int m = std::min(n_batch, n - i);
            batch.n_tokens = m;
            for (int j = 0; j < m; ++j) {
                batch.token[j]     = toks[i + j];
                batch.pos[j]       = pos0 + i + j;
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = seq;
                batch.logits[j]    = i + j == n - 1;
            }
            if (llama_decode(ctx, batch) != 0) {
                llama_batch_free(batch);
                throw std::runtime_error("llama_decode failed at position " + std::to_string(pos0 + i));
            }
        }
        llama_batch_free(batch);
    }

    void record(const float * logits) {
        char buf[32];
        snprintf(buf, sizeof(buf), "\"%016" PRIx64 "\"", fnv64(logits, n_vocab));
        steps.push_back(buf);
        llama_token best = 0;
        for (int v = 1; v < n_vocab; ++v) { if (logits[v] > logits[best]) { best = v; } }
        argmax.push_back(best);
        if (logits_out && fwrite(logits, sizeof(float), n_vocab, logits_out) != (size_t) n_vocab) {
            throw std::runtime_error("cannot write the logits file");
        }
    }

    // one decode step per token, each step's logits recorded
    void decode(llama_seq_id seq, const llama_token * toks, int n, llama_pos pos0) {
        for (int i = 0; i < n; ++i) {
            feed(seq, toks + i, 1, pos0 + i);
            record(llama_get_logits_ith(ctx, -1));
        }
    }

    // sequences 0 and 1 decoded together: each step one batch with a token of each (a
    // micro-batch holding both, one row per KV stream), both steps' logits recorded
    void decode_pair(const llama_token * toks0, llama_pos pos0, const llama_token * toks1, llama_pos pos1, int n) {
        llama_batch batch = llama_batch_init(2, 0, 1);
        for (int i = 0; i < n; ++i) {
            batch.n_tokens = 2;
            for (int j = 0; j < 2; ++j) {
                batch.token[j]     = j == 0 ? toks0[i] : toks1[i];
                batch.pos[j]       = (j == 0 ? pos0 : pos1) + i;
                batch.n_seq_id[j]  = 1;
                batch.seq_id[j][0] = j;
                batch.logits[j]    = true;
            }
            if (llama_decode(ctx, batch) != 0) {
                llama_batch_free(batch);
                throw std::runtime_error("llama_decode failed on a batch of both sequences at step " + std::to_string(i));
            }
            record(llama_get_logits_ith(ctx, 0));
            record(llama_get_logits_ith(ctx, 1));
        }
        llama_batch_free(batch);
    }

    void check(const char * after) {
        uint64_t n_rows = 0, n_stale = 0;
        if (llama_scsa_check_plans(ctx, &n_rows, &n_stale)) {
            char buf[160];
            snprintf(buf, sizeof(buf), "{\"after\": \"%s\", \"rows\": %" PRIu64 ", \"stale\": %" PRIu64 "}", after, n_rows, n_stale);
            plan_checks.push_back(buf);
            fprintf(stderr, "cachecheck: after %-32s planned rows %7" PRIu64 "  stale %5" PRIu64 "\n", after, n_rows, n_stale);
        }
        uint64_t n_blocks = 0, n_loose = 0, n_short = 0;
        if (!llama_sparse_attn_check_bounds(ctx, &n_blocks, &n_loose, &n_short)) {
            return;
        }
        char buf[160];
        snprintf(buf, sizeof(buf), "{\"after\": \"%s\", \"blocks\": %" PRIu64 ", \"loose\": %" PRIu64 ", \"short\": %" PRIu64 "}",
                 after, n_blocks, n_loose, n_short);
        checks.push_back(buf);
        fprintf(stderr, "cachecheck: after %-28s blocks %6" PRIu64 "  loose %4" PRIu64 "  short %4" PRIu64 "\n", after, n_blocks, n_loose, n_short);
    }

    void begin() {
        llama_memory_clear(mem, true);
        steps.clear(); checks.clear(); plan_checks.clear(); argmax.clear();
    }

    std::string end(const char * name) {
        auto join = [](const std::vector<std::string> & v) {
            std::string s;
            for (size_t i = 0; i < v.size(); ++i) { s += (i ? ", " : "") + v[i]; }
            return s;
        };
        std::vector<std::string> am;
        for (auto t : argmax) { am.push_back(std::to_string(t)); }
        return std::string("{\"name\": \"") + name + "\", \"steps\": [" + join(steps) + "], \"argmax\": [" + join(am) +
               "], \"checks\": [" + join(checks) + "], \"plan_checks\": [" + join(plan_checks) + "]}";
    }
};

void usage(int, char ** argv) {
    fprintf(stderr, "usage: %s -m MODEL -f TEXT -c N [--cc-prompt-tokens P] [--cc-steps K] [--cc-kv-per-seq] [--cc-logits FILE] [llama.cpp flags]\n", argv[0]);
}

} // namespace

int main(int argc, char ** argv) {
    int P = 1500, K = 8;
    bool kv_per_seq = false;
    std::string logits_path;
    std::vector<char *> rest = {argv[0]};
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if ((a == "--cc-prompt-tokens" || a == "--cc-steps" || a == "--cc-logits") && i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value\n", a.c_str());
            return 2;
        }
        if (a == "--cc-prompt-tokens") { P = std::atoi(argv[++i]); }
        else if (a == "--cc-steps") { K = std::atoi(argv[++i]); }
        else if (a == "--cc-logits") { logits_path = argv[++i]; }
        else if (a == "--cc-kv-per-seq") { kv_per_seq = true; }
        else { rest.push_back(argv[i]); }
    }
    if (P < 256 || K < 1) {
        fprintf(stderr, "error: --cc-prompt-tokens must be at least 256 and --cc-steps at least 1\n");
        return 2;
    }

    common_params params;
    if (!common_params_parse((int) rest.size(), rest.data(), params, LLAMA_EXAMPLE_COMMON, usage)) {
        return 2;
    }
    // two sequences in one stream, as llama-server's automatic slots share it: removing one of
    // them frees cells inside blocks the other still uses; or a stream each
    params.n_parallel = 2;
    params.kv_unified = !kv_per_seq;
    common_init();
    llama_backend_init();

    auto init = common_init_from_params(params);
    llama_context * ctx = init->context();
    llama_model * model = init->model();
    if (!ctx || !model) { fprintf(stderr, "error: failed to load the model\n"); return 1; }

    const std::vector<llama_token> text = common_tokenize(ctx, params.prompt, true, true);
    const int need = 3*P + 7*K;
    if ((int) text.size() < need) {
        fprintf(stderr, "error: the text has %zu tokens, the scenarios need %d (3 x --cc-prompt-tokens + 7 x --cc-steps)\n", text.size(), need);
        return 2;
    }
    // a sequence's cells: the whole cache when unified, its stream's share otherwise
    const int per_seq = kv_per_seq ? (int) llama_n_ctx_seq(ctx) : (int) llama_n_ctx(ctx);
    const int need_ctx = kv_per_seq ? P + 5*K : 2*P + 5*K;
    if (per_seq < need_ctx) {
        fprintf(stderr, "error: -c %u is too small: the scenarios need %d cells per sequence%s\n", llama_n_ctx(ctx), need_ctx,
                kv_per_seq ? " (--cc-kv-per-seq gives each of the 2 sequences half)" : "");
        return 2;
    }
    FILE * logits_out = nullptr;
    if (!logits_path.empty() && !(logits_out = fopen(logits_path.c_str(), "wb"))) {
        fprintf(stderr, "error: cannot write %s\n", logits_path.c_str());
        return 2;
    }

    runner r{ctx, llama_get_memory(ctx), llama_vocab_n_tokens(llama_model_get_vocab(model)), (int) llama_n_batch(ctx),
             logits_out, {}, {}, {}, {}};
    const llama_token * T = text.data();
    std::vector<std::string> out;

    try {
        // prompt-cache reuse: a second prompt shares a prefix that ends inside a block
        r.begin();
        r.feed(0, T, P, 0);
        r.decode(0, T + P, K, P);
        r.check("prompt and decode");
        const int cut = P/2 + 13;
        llama_memory_seq_rm(r.mem, 0, cut, -1);
        r.check("seq_rm of the suffix");
        r.feed(0, T + P + K, P/2, cut);
        r.decode(0, T + P + K + P/2, K, cut + P/2);
        r.check("the new suffix decoded");
        out.push_back(r.end("prompt-reuse"));

        // sequence removal: two sequences share a block, one of them goes
        r.begin();
        r.feed(0, T, P/2, 0);
        r.feed(1, T + P, P/2 + 7, 0);
        r.check("two sequences");
        llama_memory_seq_rm(r.mem, 1, -1, -1);
        r.check("seq_rm of sequence 1");
        r.decode(0, T + P/2, K, P/2);
        r.feed(1, T + 2*P, P/4, 0);
        r.decode(1, T + 2*P + P/4, K, P/4);
        r.check("a new sequence 1 decoded");
        out.push_back(r.end("seq-removal"));

        // context shift, as llama-server does it: keep n_keep, drop n_discard, shift the rest
        r.begin();
        r.feed(0, T, P, 0);
        const int n_keep = 69, n_discard = P/3;
        llama_memory_seq_rm (r.mem, 0, n_keep, n_keep + n_discard);
        llama_memory_seq_add(r.mem, 0, n_keep + n_discard, P, -n_discard);
        r.decode(0, T + P, K, P - n_discard);
        r.check("context shift and decode");
        out.push_back(r.end("context-shift"));

        // slot save and restore
        r.begin();
        r.feed(0, T, P, 0);
        r.decode(0, T + P, K, P);
        std::vector<uint8_t> state(llama_state_seq_get_size(ctx, 0));
        if (llama_state_seq_get_data(ctx, state.data(), state.size(), 0) != state.size()) {
            throw std::runtime_error("llama_state_seq_get_data failed");
        }
        llama_memory_seq_rm(r.mem, 0, -1, -1);
        r.feed(0, T + 2*P, P/3, 0); // something else in the cells meanwhile
        llama_memory_seq_rm(r.mem, 0, -1, -1);
        if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) {
            throw std::runtime_error("llama_state_seq_set_data failed");
        }
        r.check("restore");
        r.decode(0, T + P + K, K, P + K);
        r.check("restore and decode");
        out.push_back(r.end("save-restore"));

        // a freed first cell reused while the rest of its block still serves another sequence
        // (llama-server's slots share one cache): sequence 1 takes cells [0, n1), sequence 0 the
        // cells after it, so the block holding cell n1 starts with sequence 1's keys and goes on
        // with sequence 0's; sequence 1 goes, and a new sequence 1 is written into its cells,
        // the first cell of that block included, while sequence 0's keys there stay live
        r.begin();
        const int n1 = (P/4/32)*32 + 13; // inside a block for every block size (multiples of 32)
        r.feed(1, T + P, n1, 0);
        r.feed(0, T, P/2, 0);
        r.check("two sequences sharing a block");
        llama_memory_seq_rm(r.mem, 1, -1, -1);
        r.check("seq_rm of the first sequence");
        r.feed(1, T + 2*P, n1 - 3, 0);
        r.check("a new sequence in its cells");
        r.decode(0, T + P/2, K, P/2);
        r.check("the other sequence decoded");
        out.push_back(r.end("first-cell-reuse"));

        // keep one sequence
        r.begin();
        r.feed(1, T + P, P/3 + 5, 0);
        r.feed(0, T, P/2, 0);
        llama_memory_seq_keep(r.mem, 0);
        r.check("seq_keep of sequence 0");
        r.decode(0, T + P/2, K, P/2);
        out.push_back(r.end("seq-keep"));

        // both sequences in every micro-batch, as llama-server decodes its slots: a suffix of
        // one removed and rewritten while the other goes on, one restored from a saved state,
        // then one copied over the other (a slot taking another's prompt), both decoded after each
        r.begin();
        r.feed(0, T, P, 0);
        r.feed(1, T + P, P/2 + 7, 0);
        r.check("two sequences");
        r.decode_pair(T + 2*P, P, T + 2*P + K, P/2 + 7, K);
        r.check("both decoded together");
        const int cut1 = P/4 + 5;
        llama_memory_seq_rm(r.mem, 1, cut1, -1);
        r.check("seq_rm of sequence 1's suffix");
        r.feed(1, T + 2*P + 2*K, P/4, cut1);
        r.decode_pair(T + 2*P + 3*K, P + K, T + P + 3*K, cut1 + P/4, K);
        r.check("a new suffix, both decoded");
        {
            // a slot taken back from llama-server's prompt cache: sequence 0 saved and restored
            // into its cells while sequence 1 keeps its own
            std::vector<uint8_t> st(llama_state_seq_get_size(ctx, 0));
            if (llama_state_seq_get_data(ctx, st.data(), st.size(), 0) != st.size()) {
                throw std::runtime_error("llama_state_seq_get_data failed");
            }
            llama_memory_seq_rm(r.mem, 0, -1, -1);
            if (llama_state_seq_set_data(ctx, st.data(), st.size(), 0) != st.size()) {
                throw std::runtime_error("llama_state_seq_set_data failed");
            }
        }
        r.check("sequence 0 restored");
        r.decode_pair(T + 2*P + 6*K, P + 2*K, T + P + 6*K, cut1 + P/4 + K, K);
        r.check("both decoded after the restore");
        llama_memory_seq_rm(r.mem, 1, -1, -1);
        llama_memory_seq_cp(r.mem, 0, 1, -1, -1);
        r.decode_pair(T + 2*P + 4*K, P + 3*K, T + 2*P + 5*K, P + 3*K, K);
        r.check("sequence 0 copied to 1, both decoded");
        out.push_back(r.end("batched-pair"));
    } catch (const std::exception & e) {
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }

    // what the context holds beyond the model (KV cache, key bounds), as llama's memory
    // breakdown reports it to --fit and to the user
    size_t context_bytes = 0;
    for (const auto & [buft, data] : llama_get_memory_breakdown(ctx)) {
        context_bytes += data.context;
    }
    printf("{\"n_ctx\": %u, \"context_bytes\": %zu, \"scenarios\": [\n", llama_n_ctx(ctx), context_bytes);
    for (size_t i = 0; i < out.size(); ++i) {
        printf("  %s%s\n", out[i].c_str(), i + 1 < out.size() ? "," : "");
    }
    printf("]}\n");
    if (logits_out) {
        fclose(logits_out);
    }
    llama_backend_free();
    return 0;
}
