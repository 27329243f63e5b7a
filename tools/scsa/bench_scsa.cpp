// llama-sparse-scsa-bench: SCSA selection time only, flat against hierarchical, on synthetic
// clustered KV of one KV head (head dim 64, clusters of 128), at 32K, 131K and 524K rows.
// Flat scores every cluster and sorts them; hierarchical walks the tree until the stop holds.
// A benchmark, not a test: it prints one table from one run.
//
//   llama-sparse-scsa-bench [--rows N ...] [--queries Q] [--tau T]

#include "scsa.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace ggml_scsa;

int main(int argc, char ** argv) {
    std::vector<int64_t> sizes;
    int queries = 50;
    float tau = 1.0f;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) { fprintf(stderr, "error: %s needs a value\n", a.c_str()); return 2; }
        if (a == "--rows") { sizes.push_back(atoll(argv[++i])); }
        else if (a == "--queries") { queries = atoi(argv[++i]); }
        else if (a == "--tau") { tau = (float) atof(argv[++i]); }
        else { fprintf(stderr, "usage: %s [--rows N ...] [--queries Q] [--tau T]\n", argv[0]); return 2; }
    }
    if (sizes.empty()) { sizes = {32768, 131072, 524288}; }
    const int64_t D = 64;
    const float beta = 1.0f/std::sqrt((float) D);
    printf("| rows | clusters | plan build s | flat selection ms | hierarchical selection ms | hierarchical nodes expanded |\n");
    printf("| --: | --: | --: | --: | --: | --: |\n");
    for (int64_t n : sizes) {
        std::mt19937 rng(42);
        std::normal_distribution<float> g(0.0f, 1.0f);
        const int blobs = (int) std::max<int64_t>(8, n/512);
        std::vector<float> centres(blobs*D), keys(n*D), values(n*D);
        for (auto & c : centres) { c = 3.0f*g(rng); }
        for (int64_t r = 0; r < n; ++r) {
            const int b = (int) (rng() % blobs);
            for (int64_t d = 0; d < D; ++d) {
                keys[r*D + d] = centres[b*D + d] + 0.3f*g(rng);
                values[r*D + d] = g(rng);
            }
        }
        const auto t0 = std::chrono::steady_clock::now();
        const plan p = build_plan(keys.data(), values.data(), D, 0, n, config{});
        const tree t = build_tree(p);
        const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::vector<std::vector<float>> qs(queries, std::vector<float>(D));
        for (int i = 0; i < queries; ++i) {
            for (int64_t d = 0; d < D; ++d) { qs[i][d] = 2.0f*centres[(i % blobs)*D + d] + g(rng); }
        }
        std::vector<float> lm(p.clusters.size());
        size_t sink = 0;
        const auto t1 = std::chrono::steady_clock::now();
        for (const auto & q : qs) {
            priorities(p, q.data(), beta, lm.data());
            sink += select_open(p, lm.data(), 0.0f, tau).size();
        }
        const auto t2 = std::chrono::steady_clock::now();
        int64_t expanded = 0;
        for (const auto & q : qs) {
            const hier_selection s = select_hier(p, t, q.data(), beta, 0.0f, tau);
            expanded += s.expanded;
            sink += s.open.size();
        }
        const auto t3 = std::chrono::steady_clock::now();
        const double flat_ms = std::chrono::duration<double, std::milli>(t2 - t1).count()/queries;
        const double hier_ms = std::chrono::duration<double, std::milli>(t3 - t2).count()/queries;
        printf("| %lld | %zu | %.1f | %.3f | %.3f | %.1f |\n", (long long) n, p.clusters.size(), build_s, flat_ms, hier_ms,
               (double) expanded/queries);
        fflush(stdout);
        if (sink == (size_t) -1) { return 1; } // keep the work
    }
    printf("(tau %.3g, %d queries per size, exact mass log 0; one KV head, head dim 64)\n", tau, queries);
    return 0;
}
