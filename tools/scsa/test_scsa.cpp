// llama-sparse-scsa-test: SCSA's arithmetic (ggml-cpu/scsa) on synthetic clustered KV with
// known answers. Exit status 0 when every check passes, 1 otherwise; each failure is printed.

#include "scsa.h"

#include "ggml.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using namespace ggml_scsa;

static int n_checks = 0, n_failed = 0;

static void check(bool ok, const std::string & what) {
    n_checks++;
    if (!ok) {
        n_failed++;
        printf("FAIL: %s\n", what.c_str());
    }
}

struct kv {
    int64_t D, n;
    std::vector<float> keys, values;
    std::vector<int> blob;   // which blob each row was drawn from
    std::vector<float> centres;
};

// n rows in `blobs` tight blobs of keys (values carry the blob's signature), in random order
static kv clustered(int64_t n, int64_t D, int blobs, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    kv x{D, n, std::vector<float>(n*D), std::vector<float>(n*D), std::vector<int>(n), std::vector<float>(blobs*D)};
    for (auto & c : x.centres) { c = 3.0f*g(rng); }
    for (int64_t r = 0; r < n; ++r) {
        const int b = (int) (rng() % blobs);
        x.blob[r] = b;
        for (int64_t d = 0; d < D; ++d) {
            x.keys[r*D + d]   = x.centres[b*D + d] + 0.3f*g(rng);
            x.values[r*D + d] = (float) ((b*7 + d) % 11) - 5.0f + 0.1f*g(rng);
        }
    }
    return x;
}

static float f16r(float v) { return ggml_fp16_to_fp32(ggml_fp32_to_fp16(v)); }

// softmax(beta q.k) v over explicit rows, in double
static std::vector<double> dense(const float * q, float beta, int64_t D,
                                 const std::vector<std::pair<const float *, const float *>> & rows,
                                 const std::vector<std::tuple<double, double, const float *>> & tails = {}) {
    std::vector<double> logits;
    for (auto & [k, v] : rows) {
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d) { s += (double) q[d]*k[d]; }
        logits.push_back(beta*s);
    }
    for (auto & [a, logm, v] : tails) { logits.push_back(a + logm); }
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> out(D, 0.0);
    double den = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
        const double w = std::exp(logits[i] - mx);
        const float * v = i < rows.size() ? rows[i].second : std::get<2>(tails[i - rows.size()]);
        den += w;
        for (int64_t d = 0; d < D; ++d) { out[d] += w*v[d]; }
    }
    for (auto & o : out) { o /= den; }
    return out;
}

static double rel_err(const float * a, const std::vector<double> & b) {
    double e = 0.0, n = 0.0;
    for (size_t d = 0; d < b.size(); ++d) { e += (a[d] - b[d])*(a[d] - b[d]); n += b[d]*b[d]; }
    return std::sqrt(e/std::max(n, 1e-30));
}

// log-sum-exp of the scores beta q.k over the exact rows, in double
static double exact_lse(const float * q, const exact_rows & ex, float beta, int64_t D) {
    std::vector<double> sc;
    for (int64_t j = 0; j < ex.n; ++j) {
        double v = 0.0;
        for (int64_t d = 0; d < D; ++d) { v += (double) q[d]*ex.keys[j*D + d]; }
        sc.push_back(beta*v);
    }
    const double mx = *std::max_element(sc.begin(), sc.end());
    double acc = 0.0;
    for (double v : sc) { acc += std::exp(v - mx); }
    return mx + std::log(acc);
}

// One decode step of GGML_OP_SCSA_ATTN on the CPU (one row, one stream, one KV head, one query
// head): the cache holds x's rows as f16, the first L visible. Returns the output row.
static std::vector<float> scsa_op_step(ggml_scsa_layer * layer, const kv & x, int64_t L, const std::vector<float> & q, float beta) {
    const int64_t D = x.D, n = x.n;
    ggml_init_params ip = { /*.mem_size =*/ (size_t) 64*1024*1024, /*.mem_buffer =*/ nullptr, /*.no_alloc =*/ false };
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * tq = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, 1, 1, 1);
    ggml_tensor * tk = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, n, 1, 1);
    ggml_tensor * tv = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, n, 1, 1);
    ggml_tensor * tm = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n, 1, 1, 1);
    memcpy(tq->data, q.data(), D*sizeof(float));
    for (int64_t i = 0; i < n*D; ++i) {
        ((ggml_fp16_t *) tk->data)[i] = ggml_fp32_to_fp16(x.keys[i]);
        ((ggml_fp16_t *) tv->data)[i] = ggml_fp32_to_fp16(x.values[i]);
    }
    for (int64_t c = 0; c < n; ++c) {
        ((ggml_fp16_t *) tm->data)[c] = ggml_fp32_to_fp16(c < L ? 0.0f : -INFINITY);
    }
    ggml_tensor * out = ggml_scsa_attn(ctx, ggml_permute(ctx, tq, 0, 2, 1, 3), tk, tv, tm, beta, layer);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    std::vector<float> res((const float *) out->data, (const float *) out->data + D);
    ggml_free(ctx);
    return res;
}

int main() {
    const int64_t D = 64, n = 4096, sink = 4, recent = 32;
    const float beta = 1.0f/std::sqrt((float) D);
    const kv x = clustered(n, D, 24, 1234);
    config cfg;
    const plan p = build_plan(x.keys.data(), x.values.data(), D, sink, n - recent, cfg);

    // a plan: a partition of the sealed rows into clusters of at most cluster_size
    {
        std::vector<int64_t> m = p.members;
        std::sort(m.begin(), m.end());
        bool perm = (int64_t) m.size() == n - recent - sink;
        for (size_t i = 0; perm && i < m.size(); ++i) { perm = m[i] == sink + (int64_t) i; }
        check(perm, "the plan's members are exactly the sealed rows");
        bool sizes = !p.clusters.empty();
        int64_t next = 0;
        for (auto & c : p.clusters) { sizes = sizes && c.count > 0 && c.count <= cfg.cluster_size && c.begin == next; next += c.count; }
        check(sizes, "clusters are contiguous and hold at most cluster_size members");
        // the split groups near keys: the keys' mean squared distance to their cluster's centroid
        // is a small part of their mean squared distance to the centroid of all keys
        double within = 0.0, total = 0.0;
        std::vector<double> all(D, 0.0);
        for (int64_t r = sink; r < n - recent; ++r) { for (int64_t d = 0; d < D; ++d) { all[d] += x.keys[r*D + d]; } }
        for (auto & a : all) { a /= (double) (n - recent - sink); }
        for (auto & c : p.clusters) {
            for (int64_t i = c.begin; i < c.begin + c.count; ++i) {
                const float * k = x.keys.data() + p.members[i]*D;
                for (int64_t d = 0; d < D; ++d) {
                    within += (k[d] - c.centroid[d])*(k[d] - c.centroid[d]);
                    total  += (k[d] - all[d])*(k[d] - all[d]);
                }
            }
        }
        // (a random partition of the same sizes keeps about all of it: 1 - 1/128)
        check(within < 0.5*total, "clusters group near keys (within-cluster spread " + std::to_string(within/total) + " of the total)");
        bool resid_ok = true;
        for (auto & c : p.clusters) { for (float r : c.resid) { resid_ok = resid_ok && r >= 0.0f; } }
        check(resid_ok, "diagonal residuals are non-negative");
    }

    // deterministic: the same input gives the same plan, bit for bit
    {
        const plan p2 = build_plan(x.keys.data(), x.values.data(), D, sink, n - recent, cfg);
        bool same = p2.members == p.members && p2.clusters.size() == p.clusters.size() && p2.keys_packed == p.keys_packed;
        for (size_t i = 0; same && i < p.clusters.size(); ++i) {
            same = p.clusters[i].eigval == p2.clusters[i].eigval && p.clusters[i].eigvec == p2.clusters[i].eigvec &&
                   p.clusters[i].centroid == p2.clusters[i].centroid;
        }
        check(same, "plans are deterministic");
    }

    // the exact rows: sinks and the recent suffix
    std::vector<float> ex_k, ex_v;
    for (int64_t r = 0; r < n; ++r) {
        if (r < sink || r >= n - recent) {
            ex_k.insert(ex_k.end(), x.keys.begin() + r*D, x.keys.begin() + (r + 1)*D);
            ex_v.insert(ex_v.end(), x.values.begin() + r*D, x.values.begin() + (r + 1)*D);
        }
    }
    const exact_rows ex{ex_k.data(), ex_v.data(), (int64_t) ex_k.size()/D};

    // f16 copies of the plan's keys and values, for the direct computations
    std::vector<float> pk(p.members.size()*D), pv(p.members.size()*D);
    for (size_t i = 0; i < p.members.size(); ++i) {
        ggml_fp16_to_fp32_row((const ggml_fp16_t *) p.key_row(i),   pk.data() + i*D, D);
        ggml_fp16_to_fp32_row((const ggml_fp16_t *) p.value_row(i), pv.data() + i*D, D);
    }
    check(pk[5] == f16r(x.keys[p.members[0]*D + 5]), "packed keys are the f16 copies of the members");

    std::mt19937 rng(99);
    std::normal_distribution<float> g(0.0f, 1.0f);
    double worst_exact = 0.0, worst_tail = 0.0;
    for (int t = 0; t < 16; ++t) {
        // a query near one blob's keys, so attention is peaked as in a model
        std::vector<float> q(D);
        const int b = t % 24;
        for (int64_t d = 0; d < D; ++d) { q[d] = 2.0f*x.centres[b*D + d] + g(rng); }

        // tau = 0: every cluster opened: dense attention over the same (f16-packed) keys
        std::vector<std::pair<const float *, const float *>> rows;
        for (int64_t j = 0; j < ex.n; ++j) { rows.emplace_back(ex.keys + j*D, ex.values + j*D); }
        for (size_t i = 0; i < p.members.size(); ++i) { rows.emplace_back(pk.data() + i*D, pv.data() + i*D); }
        std::vector<float> out(D);
        counters st;
        attend(p, ex, q.data(), beta, 0.0f, out.data(), &st);
        worst_exact = std::max(worst_exact, rel_err(out.data(), dense(q.data(), beta, D, rows)));
        check(st.opened_rows == (int64_t) p.members.size() && st.exact_rows == ex.n, "tau = 0 reads every row");

        // tau = 0.2: the opened clusters exactly, the rest as m exp(a) at the value mean
        std::vector<float> lm(p.clusters.size());
        priorities(p, q.data(), beta, lm.data());
        const double lse_ex = exact_lse(q.data(), ex, beta, D);
        const std::vector<int32_t> open = select_open(p, lm.data(), (float) lse_ex, 0.2f);
        std::vector<uint8_t> is_open(p.clusters.size(), 0);
        for (int32_t i : open) { is_open[i] = 1; }
        std::vector<std::pair<const float *, const float *>> rows2;
        std::vector<std::tuple<double, double, const float *>> tails;
        for (int64_t j = 0; j < ex.n; ++j) { rows2.emplace_back(ex.keys + j*D, ex.values + j*D); }
        for (size_t i = 0; i < p.clusters.size(); ++i) {
            const cluster & c = p.clusters[i];
            if (is_open[i]) {
                for (int64_t r = c.begin; r < c.begin + c.count; ++r) { rows2.emplace_back(pk.data() + r*D, pv.data() + r*D); }
            } else {
                double a = 0.0;
                for (int64_t d = 0; d < D; ++d) { a += (double) q[d]*c.centroid[d]; }
                tails.emplace_back(beta*a, std::log((double) c.count), c.value_mean.data());
            }
        }
        counters st2;
        attend(p, ex, q.data(), beta, 0.2f, out.data(), &st2);
        worst_tail = std::max(worst_tail, rel_err(out.data(), dense(q.data(), beta, D, rows2, tails)));
        check(st2.opened_rows < st.opened_rows && !open.empty(), "tau = 0.2 opens fewer rows than tau = 0");
        check(lm[open[0]] == *std::max_element(lm.begin(), lm.end()), "clusters open best first");

        // the matrix-product form (several queries against the concatenated summaries, in two
        // cluster ranges) gives every query the same estimates bit for bit
        {
            const int32_t nq = 3, n = (int32_t) p.clusters.size(), half = n/2;
            std::vector<float> qs(nq*D), q2s(nq*D), lm3((size_t) nq*n), a3((size_t) nq*n);
            for (int32_t j = 0; j < nq; ++j) {
                for (int64_t d = 0; d < D; ++d) {
                    qs[j*D + d]  = q[d]*(1.0f + 0.5f*j) - 0.1f*j;
                    q2s[j*D + d] = qs[j*D + d]*qs[j*D + d];
                }
            }
            estimates_multi(p, nq, qs.data(), q2s.data(), beta, lm3.data(), a3.data(), n, 0, half);
            estimates_multi(p, nq, qs.data(), q2s.data(), beta, lm3.data(), a3.data(), n, half, n);
            bool same = true;
            for (int32_t j = 0; j < nq; ++j) {
                std::vector<float> lm1(n), a1(n);
                estimates(p, qs.data() + j*D, q2s.data() + j*D, beta, lm1.data(), a1.data());
                same = same && memcmp(lm1.data(), lm3.data() + (size_t) j*n, n*sizeof(float)) == 0 &&
                       memcmp(a1.data(), a3.data() + (size_t) j*n, n*sizeof(float)) == 0;
            }
            check(same, "the estimates as matrix products equal the per-query estimates bit for bit");
        }

        // errors grow with tau, and tau = 0 has none
        const std::vector<float> grid = {0.0f, 0.01f, 0.05f, 0.2f, 0.5f};
        const std::vector<float> err = replay_errors(p, ex, q.data(), beta, grid);
        check(err[0] == 0.0f, "the replay at tau = 0 is the exact output");
        check(err[4] >= err[1], "a larger tau does not give a smaller error here");
    }
    check(worst_exact < 1e-5, "tau = 0 equals dense attention over the same keys (worst relative error " + std::to_string(worst_exact) + ")");
    check(worst_tail < 1e-5, "the tail term equals its direct computation (worst relative error " + std::to_string(worst_tail) + ")");

    // hierarchical mode: exact aggregates, tau = 0 is dense, any tau equals its direct computation
    {
        const tree t = build_tree(p);
        const tree_node & root = t.nodes[t.root];
        check(root.count == (int64_t) p.members.size(), "the tree's root holds every member");
        double worst_c = 0.0, worst_v = 0.0;
        for (int64_t d = 0; d < D; ++d) {
            double mean = 0.0, m2 = 0.0;
            for (int64_t r : p.members) { mean += x.keys[r*D + d]; }
            mean /= (double) p.members.size();
            for (int64_t r : p.members) { m2 += (x.keys[r*D + d] - mean)*(x.keys[r*D + d] - mean); }
            m2 /= (double) p.members.size();
            worst_c = std::max(worst_c, std::fabs(root.centroid[d] - mean));
            worst_v = std::max(worst_v, std::fabs(root.diag_var[d] - m2)/std::max(m2, 1e-9));
        }
        check(worst_c < 1e-4 && worst_v < 1e-3, "the root aggregates centroid and diagonal variance exactly (worst " +
              std::to_string(worst_c) + ", " + std::to_string(worst_v) + ")");
        std::mt19937 rq(5);
        double worst0 = 0.0, worst2 = 0.0;
        for (int tq = 0; tq < 8; ++tq) {
            std::vector<float> q(D);
            for (int64_t d = 0; d < D; ++d) { q[d] = 2.0f*x.centres[(tq*5 % 24)*D + d] + g(rq); }
            std::vector<float> flat(D), hier(D);
            attend(p, ex, q.data(), beta, 0.0f, flat.data());
            attend_hier(p, t, ex, q.data(), beta, 0.0f, hier.data());
            std::vector<double> fd(flat.begin(), flat.end());
            worst0 = std::max(worst0, rel_err(hier.data(), fd));

            // tau = 0.2: open leaves exactly, the frontier's aggregates as tails
            const double lse = exact_lse(q.data(), ex, beta, D);
            const hier_selection sel = select_hier(p, t, q.data(), beta, (float) lse, 0.2f);
            std::vector<std::pair<const float *, const float *>> rows;
            std::vector<std::tuple<double, double, const float *>> tails;
            for (int64_t j = 0; j < ex.n; ++j) { rows.emplace_back(ex.keys + j*D, ex.values + j*D); }
            for (int32_t i : sel.open) {
                const cluster & c = p.clusters[i];
                for (int64_t r = c.begin; r < c.begin + c.count; ++r) { rows.emplace_back(pk.data() + r*D, pv.data() + r*D); }
            }
            int64_t covered = 0;
            for (int32_t i : sel.open) { covered += p.clusters[i].count; }
            for (int32_t id : sel.tails) {
                const tree_node & n = t.nodes[id];
                double a = 0.0;
                for (int64_t d = 0; d < D; ++d) { a += (double) q[d]*n.centroid[d]; }
                tails.emplace_back(beta*a, std::log((double) n.count), n.value_mean.data());
                covered += n.count;
            }
            check(covered == (int64_t) p.members.size(), "open leaves and tail nodes cover every member once");
            attend_hier(p, t, ex, q.data(), beta, 0.2f, hier.data());
            worst2 = std::max(worst2, rel_err(hier.data(), dense(q.data(), beta, D, rows, tails)));
            check(!sel.open.empty() && sel.open.size() < p.clusters.size(), "tau = 0.2 opens some leaves, not all");
            const hier_selection one = select_hier(p, t, q.data(), beta, (float) lse, 1.0f);
            check(one.open.size() <= 1 && one.expanded <= 2*(int64_t) std::ceil(std::log2((double) p.clusters.size())) + 1,
                  "tau = 1 walks at most one path down the tree");
        }
        check(worst0 < 1e-5, "hierarchical tau = 0 equals flat tau = 0 (worst relative error " + std::to_string(worst0) + ")");
        check(worst2 < 1e-5, "hierarchical tails equal their direct computation (worst relative error " + std::to_string(worst2) + ")");
    }

    // a growing cache: plans kept up incrementally, frozen regions, exact attention at tau = 0,
    // and a truncation that must not leave a stale plan
    {
        const int64_t N = 6000;
        kv y = clustered(N, D, 16, 777);
        head_plans hp;
        hp.cfg.sink = 4; hp.cfg.recent = 32; hp.cfg.rebuild_interval = 256; hp.cfg.block_size = 1024;
        bool invariants = true;
        int64_t updates = 0;
        for (int64_t n_rows = 1; n_rows <= N; n_rows += 37) {
            updates += hp.update(y.keys.data(), y.values.data(), D, n_rows);
            int64_t next = hp.cfg.sink;
            for (size_t i = 0; i < hp.regions.size(); ++i) {
                const plan & r = hp.regions[i];
                invariants = invariants && r.begin == next && r.end > r.begin &&
                             (i + 1 == hp.regions.size() || r.end - r.begin == hp.cfg.block_size) &&
                             r.end - r.begin <= hp.cfg.block_size;
                next = r.end;
            }
            invariants = invariants && hp.sealed_end() <= std::max<int64_t>(hp.cfg.sink, n_rows - hp.cfg.recent) &&
                         n_rows - hp.cfg.recent - hp.sealed_end() < hp.cfg.rebuild_interval;
        }
        check(invariants, "regions stay contiguous from the sinks, frozen at block_size, at most one interval behind");
        check(hp.rebuilds <= (N/hp.cfg.rebuild_interval) + (N/hp.cfg.block_size) + 1 && updates > 0,
              "maintenance rebuilds only the growing tail (" + std::to_string(hp.rebuilds) + " plans built)");

        auto dense_all = [&](const kv & z, int64_t n_rows, const float * q) {
            // the sealed rows as packed (f16), the rest exact
            std::vector<float> kf(n_rows*D), vf(n_rows*D);
            for (int64_t r = 0; r < n_rows; ++r) {
                const bool sealed = r >= hp.cfg.sink && r < hp.sealed_end();
                for (int64_t d = 0; d < D; ++d) {
                    kf[r*D + d] = sealed ? f16r(z.keys[r*D + d]) : z.keys[r*D + d];
                    vf[r*D + d] = sealed ? f16r(z.values[r*D + d]) : z.values[r*D + d];
                }
            }
            std::vector<std::pair<const float *, const float *>> rows;
            for (int64_t r = 0; r < n_rows; ++r) { rows.emplace_back(kf.data() + r*D, vf.data() + r*D); }
            return dense(q, beta, D, rows);
        };
        std::vector<float> q(D), out(D);
        for (int64_t d = 0; d < D; ++d) { q[d] = 2.0f*y.centres[3*D + d] + g(rng); }
        int64_t n_now = ((N - 1)/37)*37 + 1;
        attend_store(hp, y.keys.data(), y.values.data(), D, n_now, q.data(), beta, 0.0f, out.data());
        const double e0 = rel_err(out.data(), dense_all(y, n_now, q.data()));
        check(e0 < 1e-5, "tau = 0 over the store is dense attention over the cache (relative error " + std::to_string(e0) + ")");

        // truncate to 2500 rows, write other keys there, grow again: a stale plan would attend
        // to keys the cache no longer holds
        hp.update(y.keys.data(), y.values.data(), D, 2500);
        bool dropped = true;
        for (const plan & r : hp.regions) { dropped = dropped && r.end <= 2500; }
        check(dropped, "a truncated cache drops every region reaching past it");
        kv z = y;
        std::mt19937 rz(4242);
        for (int64_t r = 2500; r < N; ++r) {
            for (int64_t d = 0; d < D; ++d) { z.keys[r*D + d] = -y.keys[r*D + d] + 0.5f*g(rz); z.values[r*D + d] = g(rz); }
        }
        for (int64_t n_rows = 2500; n_rows <= N; n_rows += 37) { hp.update(z.keys.data(), z.values.data(), D, n_rows); }
        n_now = 2500 + ((N - 2500)/37)*37;
        attend_store(hp, z.keys.data(), z.values.data(), D, n_now, q.data(), beta, 0.0f, out.data());
        const double e1 = rel_err(out.data(), dense_all(z, n_now, q.data()));
        check(e1 < 1e-5, "after truncation and regrowth the plans hold the new keys (relative error " + std::to_string(e1) + ")");
        counters st;
        attend_store(hp, z.keys.data(), z.values.data(), D, n_now, q.data(), beta, 0.2f, out.data(), &st);
        check(st.opened_rows > 0 && st.exact_rows >= hp.cfg.sink + hp.cfg.recent, "the store opens clusters across regions");
    }

    // calibration on a constructed error curve: grid 0.01 0.02 0.05 0.1; medians 0.004 0.02 0.03 0.2
    {
        const std::vector<float> grid = {0.01f, 0.02f, 0.05f, 0.1f};
        const std::vector<std::vector<float>> errors = {
            {0.002f, 0.010f, 0.030f, 0.1f}, {0.004f, 0.020f, 0.030f, 0.2f}, {0.009f, 0.050f, 0.028f, 0.3f},
        };
        check(choose_tau(errors, grid, 0.025f, 10.0f, 0.05f) == 0.02f, "calibration freezes the largest tau whose median error meets the tolerance");
        check(choose_tau(errors, grid, 0.025f, 0.04f, 0.05f) == 0.01f, "a tau whose worst step exceeds max_error is not chosen, however good its median");
        check(choose_tau(errors, grid, 0.025f, 0.001f, 0.05f) == 0.0f, "no tau keeps the worst step: the head runs exact (tau 0)");
        check(choose_tau(errors, grid, 0.001f, 10.0f, 0.05f) == 0.0f, "no tau meets the tolerance: the head runs exact (tau 0), never the fallback");
        check(choose_tau({}, grid, 0.025f, 0.5f, 0.05f) == 0.05f, "no steps recorded: the fallback");
    }

    // a cache truncated below the sealed end invalidates the plan; a new plan covers what is left
    {
        check(p.valid_for(n) && p.valid_for(n - recent), "the plan holds while the cache keeps its rows");
        check(!p.valid_for(n/2), "a cache truncated below the plan's end drops the plan");
        const plan q2 = build_plan(x.keys.data(), x.values.data(), D, sink, n/2 - recent, cfg);
        int64_t maxrow = 0;
        for (int64_t r : q2.members) { maxrow = std::max(maxrow, r); }
        check(q2.valid_for(n/2) && maxrow < n/2 - recent, "the new plan covers only the rows left");
    }

    // all-equal keys: splitting by row, no NaN anywhere
    {
        std::vector<float> k(1000*D, 0.5f), v(1000*D, 1.0f);
        const plan pe = build_plan(k.data(), v.data(), D, 0, 1000, cfg);
        std::vector<float> q(D, 1.0f), out(D);
        attend(pe, exact_rows{}, q.data(), beta, 0.1f, out.data());
        bool finite = true;
        for (float o : out) { finite = finite && std::isfinite(o) && std::fabs(o - 1.0f) < 1e-6f; }
        check(pe.clusters.size() == 8 && finite, "all-equal keys: 8 clusters of at most 128, output the common value");
    }

    // non-finite estimates: one inf key makes its cluster's moment estimate NaN. A NaN is no
    // estimate at all, so it ranks first (as a NaN block bound does on the block path) and the
    // stop rule, with nothing to stop on, opens every cluster; the sort never compares a NaN
    {
        const std::vector<float> lm = {1.0f, NAN, 3.0f, 2.0f, NAN, 0.5f};
        stop_rule rule;
        rule.init(lm.data(), (int32_t) lm.size(), -INFINITY);
        check(rule.order == std::vector<int32_t>({1, 4, 2, 3, 0, 5}),
              "NaN estimates rank first (the earlier first), then the others by estimate");
        bool all = true;
        for (float tau : {0.001f, 0.05f, 0.5f}) { all = all && rule.open_count(tau) == (int32_t) lm.size(); }
        check(all, "a NaN estimate: the stop rule opens every cluster, at every tau");
        check(choose_tau({{0.0f, NAN}, {0.0f, 0.01f}, {0.0f, 0.01f}}, {0.0f, 0.01f}, 0.025f, 0.5f, 0.05f) == 0.0f,
              "a NaN calibration error is the worst error there is: no tau keeps it, the head runs exact");
    }

    // inf and NaN keys: the plan still holds every row once, in clusters of at most the cluster
    // size (the split direction is NaN for a cluster holding an inf key)
    {
        std::vector<float> k = x.keys;
        k[(sink + 5)*D + 3] = INFINITY;
        k[(sink + 900)*D + 0] = -INFINITY;
        k[(sink + 1700)*D + 7] = NAN;
        const plan pi = build_plan(k.data(), x.values.data(), D, sink, n - recent, cfg);
        std::vector<int64_t> m = pi.members;
        std::sort(m.begin(), m.end());
        bool perm = (int64_t) m.size() == n - recent - sink;
        for (size_t i = 0; perm && i < m.size(); ++i) { perm = m[i] == sink + (int64_t) i; }
        bool sized = true;
        for (const auto & c : pi.clusters) { sized = sized && c.count >= 1 && c.count <= cfg.cluster_size; }
        check(perm && sized, "inf and NaN keys: every row planned once, clusters within the cluster size");
    }

    // q8_0 packing: the same clusters, members packed in q8_0; with every cluster opened the
    // answer is dense attention over the q8_0-rounded keys and values (within their rounding)
    {
        config c8 = cfg;
        c8.packed = GGML_TYPE_Q8_0;
        const plan p8 = build_plan(x.keys.data(), x.values.data(), D, sink, n - recent, c8);
        check(p8.members == p.members && p8.row_bytes == ggml_row_size(GGML_TYPE_Q8_0, D),
              "q8_0 packing: the same members, rows of a q8_0 row's size");
        std::vector<float> q(D), o16(D), o8(D);
        for (int64_t d = 0; d < D; ++d) { q[d] = x.centres[d] + 0.1f*(float) (d % 5); }
        attend(p, exact_rows{}, q.data(), beta, 0.0f, o16.data());
        attend(p8, exact_rows{}, q.data(), beta, 0.0f, o8.data());
        std::vector<double> ref(o16.begin(), o16.end());
        const double e = rel_err(o8.data(), ref);
        check(e > 0.0 && e < 2e-2, "q8_0 packing at tau 0 within q8_0 rounding of f16 packing (rel err " + std::to_string(e) + ")");
    }

    // one sort serves every tau: the stop rule's prefix for tau is what select_open opens
    {
        std::vector<float> q(D), lm(p.clusters.size());
        for (int64_t d = 0; d < D; ++d) { q[d] = x.centres[2*D + d]; }
        priorities(p, q.data(), beta, lm.data());
        stop_rule rule;
        rule.init(lm.data(), (int32_t) lm.size(), -INFINITY);
        bool same = true, monotone = true;
        int32_t last = (int32_t) lm.size();
        for (float tau : {0.0f, 0.001f, 0.01f, 0.05f, 0.2f, 0.5f}) {
            const std::vector<int32_t> open = select_open(p, lm.data(), -INFINITY, tau);
            const int32_t k = rule.open_count(tau);
            same = same && (int32_t) open.size() == k && std::equal(open.begin(), open.end(), rule.order.begin());
            monotone = monotone && k <= last;
            last = k;
        }
        check(same, "stop_rule: open_count(tau) is the prefix select_open opens, for every tau");
        check(monotone && rule.open_count(0.0f) == (int32_t) lm.size(), "stop_rule: a larger tau opens no more; tau 0 opens all");
    }

    // the rows a rebuild needs are all update_rows reads, and it plans what update plans
    {
        store_config sc;
        sc.rebuild_interval = 256;
        sc.block_size       = 1024;
        head_plans full, rows;
        full.cfg = rows.cfg = sc;
        int64_t lo = INT64_MAX, hi = 0;
        for (int64_t n_rows = 300; n_rows <= n; n_rows += 211) {
            full.update(x.keys.data(), x.values.data(), D, n_rows);
            rows.update_rows([&](int64_t r0, int64_t r1, float * k, float * v) {
                lo = std::min(lo, r0);
                hi = std::max(hi, r1);
                std::copy(x.keys.begin() + r0*D, x.keys.begin() + r1*D, k);
                std::copy(x.values.begin() + r0*D, x.values.begin() + r1*D, v);
            }, D, n_rows);
        }
        bool same = full.regions.size() == rows.regions.size();
        for (size_t r = 0; same && r < full.regions.size(); ++r) {
            same = full.regions[r].members == rows.regions[r].members && full.regions[r].keys_packed == rows.regions[r].keys_packed;
        }
        check(same && !full.regions.empty(), "update_rows builds the same plans as update");
        check(lo >= sc.sink && hi <= n - sc.recent, "update_rows reads only sealed rows");
    }

    // hierarchical over a store: one region's walk is select_hier's
    {
        head_plans hp;
        hp.regions.push_back(p);
        std::vector<tree> trees = {build_tree(p)};
        std::vector<float> q(D);
        for (int64_t d = 0; d < D; ++d) { q[d] = x.centres[3*D + d]; }
        bool same = true;
        for (float tau : {0.0f, 0.02f, 0.2f}) {
            const hier_selection one = select_hier(p, trees[0], q.data(), beta, -INFINITY, tau);
            const hier_selection_multi many = select_hier_multi(hp, trees, q.data(), beta, -INFINITY, tau);
            std::vector<int32_t> open_many;
            for (const auto & [r, c] : many.open) { open_many.push_back(c); }
            same = same && one.open == open_many && one.expanded == many.expanded;
        }
        check(same, "select_hier_multi over one region walks as select_hier");
    }

    // the op's audits: once the taus are frozen, the first audit_steps decode steps after a prompt
    // (the visible rows did not grow by one) are exact, and a head whose tau erred more than
    // max_error there takes a smaller one; the steps after them go through the plans
    {
        const int64_t n_cells = 1536;
        kv c = clustered(n_cells, D, 24, 99);
        std::vector<float> q(D);
        for (int64_t d = 0; d < D; ++d) { q[d] = 0.25f*(c.centres[5*D + d] + c.centres[11*D + d]); }
        auto exact_of = [&](int64_t L) {
            std::vector<float> kr(L*D), vr(L*D);
            std::vector<std::pair<const float *, const float *>> rows;
            for (int64_t i = 0; i < L*D; ++i) { kr[i] = f16r(c.keys[i]); vr[i] = f16r(c.values[i]); }
            for (int64_t r = 0; r < L; ++r) { rows.push_back({kr.data() + r*D, vr.data() + r*D}); }
            return dense(q.data(), beta, D, rows);
        };
        auto layer_of = [&](int32_t audit_steps, float max_error) {
            ggml_scsa_params sp = ggml_scsa_default_params();
            sp.cluster_size     = 32;
            sp.rebuild_interval = 128;
            sp.block_size       = 512;
            sp.recent           = 16;
            sp.calib_steps      = 0;      // frozen from the start at tau_default, as a loaded taus file
            sp.tau_default      = 0.3f;
            sp.max_error        = max_error;
            sp.audit_steps      = audit_steps;
            return ggml_scsa_layer_new(&sp, 1, 1, (int32_t) D, 1);
        };
        ggml_scsa_counters cn;
        bool frozen = false;

        // without audits the loose tau reads little and errs: the case is one an audit must catch
        ggml_scsa_layer * plain = layer_of(0, 0.05f);
        scsa_op_step(plain, c, 1400, q, beta);                  // plans built
        const double err_plain = rel_err(scsa_op_step(plain, c, 1401, q, beta).data(), exact_of(1401));
        ggml_scsa_layer_counters(plain, -1, &cn);
        check(err_plain > 0.05 && cn.audit_steps == 0 && ggml_scsa_layer_get_tau(plain, 0, &frozen) == 0.3f,
              "without audits a loose tau stays and errs (relative error " + std::to_string(err_plain) + ")");
        ggml_scsa_layer_free(plain);

        ggml_scsa_layer * layer = layer_of(2, 0.05f);
        const double e1 = rel_err(scsa_op_step(layer, c, 1400, q, beta).data(), exact_of(1400));
        ggml_scsa_layer_counters(layer, -1, &cn);
        const float tau1 = ggml_scsa_layer_get_tau(layer, 0, &frozen);
        check(e1 < 1e-3 && cn.audit_steps == 1, "an audited step is exact (relative error " + std::to_string(e1) + ")");
        check(tau1 < 0.3f && cn.taus_tightened == 1 && frozen, "an audit lowers a tau that erred more than max_error (now " +
              std::to_string(tau1) + ")");
        const double e2 = rel_err(scsa_op_step(layer, c, 1401, q, beta).data(), exact_of(1401));
        const double e3 = rel_err(scsa_op_step(layer, c, 1402, q, beta).data(), exact_of(1402));
        ggml_scsa_layer_counters(layer, -1, &cn);
        check(cn.audit_steps == 2 && e2 < 1e-3, "audit_steps steps after a prompt are audited, no more");
        check(e3 <= 0.05 && e3 > 0.0 && cn.calls > 0, "the step after the audits reads through the plans within max_error (relative error " +
              std::to_string(e3) + ")");
        check(ggml_scsa_layer_get_tau(layer, 0, nullptr) == tau1 && cn.taus_tightened == 1, "a tau that served its audit is kept");
        // a request after a truncation: its first steps are audited again; taus never loosen
        ggml_scsa_layer_truncate(layer, 0, 1200);
        scsa_op_step(layer, c, 1300, q, beta);
        ggml_scsa_layer_counters(layer, -1, &cn);
        check(cn.audit_steps == 3 && ggml_scsa_layer_get_tau(layer, 0, nullptr) <= tau1, "a new prompt is audited again; taus only tighten");
        printf("scsa audits: tau 0.3 errs %.3f without them; audited, tau %g, the next step errs %.4f\n", err_plain, tau1, e3);
        ggml_scsa_layer_free(layer);

        // a max_error the loose tau already meets: audited, nothing lowered
        ggml_scsa_layer * lenient = layer_of(2, 10.0f);
        scsa_op_step(lenient, c, 1400, q, beta);
        ggml_scsa_layer_counters(lenient, -1, &cn);
        check(cn.audit_steps == 1 && cn.taus_tightened == 0 && ggml_scsa_layer_get_tau(lenient, 0, nullptr) == 0.3f,
              "an audit keeps a tau that erred within max_error");
        ggml_scsa_layer_free(lenient);
    }

    printf("scsa: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
