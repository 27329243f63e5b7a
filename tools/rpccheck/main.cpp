// llama-sparse-rpccheck: one graph of our ops sent to a ggml-rpc-server, well formed or not.
//
// A client of the RPC protocol can put anything in a node: op params, shapes, the data of its
// sources. The server must refuse a node of ours it cannot validate before any kernel runs it.
// This tool builds one case's graph with the ggml API (valid shapes), then spoils it the way a
// hostile client would (op params written after construction, row indices set as data, an earlier
// node of the same graph writing into bytes the server has already checked, sources taken away),
// sends it and reads the result back. Exit status 0 with "ok" when the server answered; a refused
// graph closes the connection, so the read fails and the RPC client aborts (non-zero). A tensor
// allocated just before the key bounds (the canary) is read back too: a write outside the bounds
// lands there, and the tool exits 3 saying so.
//
// The case "supports" computes nothing: it asks the server's device, through the RPC device's
// supports_op, whether it runs each flash attention with a selection below, and prints the answers.
//
//   llama-sparse-rpccheck HOST:PORT CASE
// CASE: valid | scsa-host-pointer | fill-negative-row | fill-row-past-end | fill-block-size-0 |
//       select-coverage-nan | select-tolerance-nan | select-block-size-0 | fa-block-size-0 | fa-selection-shape |
//       fill-rows-rewritten-negative | fill-rows-rewritten-past-end | fa-selection-rewritten |
//       fa-tail-without-selection | fa-heads-not-divisible | fa-backend-lacks | supports

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static void set_f32(ggml_tensor * t, float v) {
    std::vector<float> x(ggml_nelements(t), v);
    for (size_t i = 0; i < x.size(); ++i) { x[i] = v*(float) ((i*7919) % 101)/101.0f - 0.5f; }
    ggml_backend_tensor_set(t, x.data(), 0, ggml_nbytes(t));
}

static void set_f16(ggml_tensor * t) {
    std::vector<ggml_fp16_t> x(ggml_nelements(t));
    for (size_t i = 0; i < x.size(); ++i) { x[i] = ggml_fp32_to_fp16((float) ((i*104729) % 97)/97.0f - 0.5f); }
    ggml_backend_tensor_set(t, x.data(), 0, ggml_nbytes(t));
}

// One flash attention with a block selection, unallocated, as the scheduler asks a device about it
struct fa_shape {
    const char * name;
    int64_t      q_heads, kv_heads;
    ggml_type    k_type;
    bool         tail_without_selection;
};

static int supports(const std::string & endpoint) {
    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());
    if (!reg || ggml_backend_reg_dev_count(reg) == 0) {
        fprintf(stderr, "error: no RPC device at %s\n", endpoint.c_str());
        return 2;
    }
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    const fa_shape shapes[] = {
        {"valid",                  4, 2, GGML_TYPE_F16, false},
        {"heads-not-divisible",    4, 3, GGML_TYPE_F16, false},
        {"tail-without-selection", 4, 2, GGML_TYPE_F16, true},
        {"backend-lacks",          4, 2, GGML_TYPE_I32, false},
    };
    printf("supports");
    for (const fa_shape & sh : shapes) {
        const int64_t D = 64, n_kv = 1024, block = 64, n_blocks = n_kv/block;
        ggml_init_params ip = { 32*ggml_tensor_overhead(), nullptr, true };
        ggml_context * ctx = ggml_init(ip);
        ggml_tensor * q    = ggml_permute(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, sh.q_heads, 1, 1), 0, 2, 1, 3);
        ggml_tensor * k    = ggml_permute(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, 2, n_kv, 1), 0, 2, 1, 3);
        ggml_tensor * v    = ggml_permute(ctx, ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, 2, n_kv, 1), 0, 2, 1, 3);
        ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);
        ggml_tensor * sel  = ggml_new_tensor_4d(ctx, GGML_TYPE_I32, (n_blocks + 31)/32 + 2, 2, 1, 1);
        ggml_tensor * fa   = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_block_sel(fa, sel, (int) block);
        // the spoiling, after the constructors' checks, as a client may send any node
        k->ne[2] = v->ne[2] = sel->ne[1] = sh.kv_heads;
        k->type  = sh.k_type;
        if (sh.tail_without_selection) { fa->src[6] = fa->src[5]; fa->src[5] = nullptr; }
        printf(" %s=%d", sh.name, ggml_backend_dev_supports_op(dev, fa) ? 1 : 0);
        ggml_free(ctx);
    }
    printf("\n");
    return 0;
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOST:PORT CASE\n", argv[0]);
        return 2;
    }
    const std::string endpoint = argv[1], which = argv[2];
    static const char * cases[] = {"valid", "scsa-host-pointer", "fill-negative-row", "fill-row-past-end", "fill-block-size-0",
                                   "select-coverage-nan", "select-tolerance-nan", "select-block-size-0", "fa-block-size-0",
                                   "fa-selection-shape", "fill-rows-rewritten-negative", "fill-rows-rewritten-past-end",
                                   "fa-selection-rewritten", "fa-tail-without-selection", "fa-heads-not-divisible",
                                   "fa-backend-lacks", "supports"};
    bool known = false;
    for (const char * c : cases) { known = known || which == c; }
    if (!known) {
        fprintf(stderr, "error: unknown case '%s'\n", which.c_str());
        return 2;
    }

    ggml_backend_t backend = ggml_backend_rpc_init(endpoint.c_str(), 0);
    if (!backend) {
        fprintf(stderr, "error: cannot connect to %s\n", endpoint.c_str());
        return 2;
    }

    if (which == "supports") {
        return supports(endpoint);
    }

    const int64_t D = 64, H_kv = 2, gqa = 2, n_kv = 1024, block = 64, n_blocks = n_kv/block, n_new = 8;
    ggml_init_params ip = { 64*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);

    // allocated first, so it lies just before the bounds: a fill row below zero writes up to 16
    // blocks (16 KiB) below them, into it
    ggml_tensor * canary = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16*2*D*H_kv);
    ggml_tensor * bounds = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 2*D, H_kv, n_blocks, 1);
    ggml_tensor * k_cur  = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H_kv, n_new);
    ggml_tensor * k_idxs = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_new);
    ggml_tensor * q_in   = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, D, H_kv*gqa, 1, 1);
    ggml_tensor * kc     = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, H_kv, n_kv, 1);
    ggml_tensor * vc     = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, D, H_kv, n_kv, 1);
    ggml_tensor * mask   = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);

    ggml_tensor * q = ggml_permute(ctx, q_in, 0, 2, 1, 3);
    ggml_tensor * k = ggml_permute(ctx, kc, 0, 2, 1, 3);
    ggml_tensor * v = ggml_permute(ctx, vc, 0, 2, 1, 3);

    ggml_tensor * out = nullptr;
    ggml_tensor * node = nullptr;   // the node a case spoils
    ggml_tensor * writer = nullptr; // a node computed before the others that rewrites checked bytes
    ggml_tensor * hostile = nullptr;
    if (which == "scsa-host-pointer") {
        // any address will do: the server must never dereference a pointer from the wire
        out = ggml_scsa_attn(ctx, q, k, v, mask, 0.125f, (ggml_scsa_layer *) (uintptr_t) 0x7f0000001000ull);
    } else {
        ggml_tensor * filled = ggml_sparse_attn_fill(ctx, bounds, k_cur, k_idxs, (int) block, (int) n_kv);
        ggml_tensor * sel    = ggml_sparse_attn_select(ctx, q, filled, mask, (int) block, 0, 0.25f, 4, 64);
        out = ggml_flash_attn_ext(ctx, q, k, v, mask, 0.125f, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_block_sel(out, sel, (int) block);
        if (which.rfind("fill-", 0) == 0)   { node = filled; }
        if (which.rfind("select-", 0) == 0) { node = sel; }
        if (which.rfind("fa-", 0) == 0)     { node = out; }
        if (which.rfind("fill-rows-rewritten", 0) == 0) {
            // the server reads the row indices before the graph runs; this copy, the graph's first
            // node, rewrites them after that, before the fill reads them
            hostile = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_new);
            writer  = ggml_cpy(ctx, hostile, k_idxs);
        }
        if (which == "fa-heads-not-divisible") {
            // the attention's own selection, shaped for 3 KV heads (the select node's stays valid)
            hostile = ggml_new_tensor_4d(ctx, GGML_TYPE_I32, sel->ne[0], 3, sel->ne[2], sel->ne[3]);
        }
        if (which == "fa-selection-rewritten") {
            // every bit set (blocks past the cache's end too) and counts that say nothing: the
            // attention must read no row and no word outside its tensors
            hostile = ggml_new_tensor_4d(ctx, GGML_TYPE_I32, sel->ne[0], sel->ne[1], sel->ne[2], sel->ne[3]);
            writer  = ggml_cpy(ctx, hostile, sel);
        }
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    if (writer) {
        ggml_build_forward_expand(gf, writer);
    }
    ggml_build_forward_expand(gf, out);

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) {
        fprintf(stderr, "error: cannot allocate on %s\n", endpoint.c_str());
        return 2;
    }
    std::vector<float> b0(ggml_nelements(bounds));
    for (int64_t r = 0; r < H_kv*n_blocks; ++r) {
        for (int64_t d = 0; d < D; ++d) { b0[r*2*D + d] = -1.0f; b0[r*2*D + D + d] = 1.0f; }
    }
    ggml_backend_tensor_set(bounds, b0.data(), 0, ggml_nbytes(bounds));
    set_f32(k_cur, 1.0f);
    set_f32(q_in, 1.0f);
    set_f16(kc);
    set_f16(vc);
    std::vector<ggml_fp16_t> m(n_kv, ggml_fp32_to_fp16(0.0f));
    ggml_backend_tensor_set(mask, m.data(), 0, ggml_nbytes(mask));
    std::vector<int64_t> rows(n_new);
    for (int64_t i = 0; i < n_new; ++i) { rows[i] = 500 + i; }

    // the spoiling, after every constructor has checked its arguments
    if (which == "fill-negative-row")   { rows[3] = -1000; }
    if (which == "fill-row-past-end")   { rows[5] = n_kv + 100; }
    if (which == "fill-block-size-0")   { node->op_params[0] = 0; }
    if (which == "select-block-size-0") { node->op_params[0] = 0; }
    if (which == "select-coverage-nan") { const float nan = NAN; memcpy(&node->op_params[2], &nan, sizeof(float)); }
    if (which == "select-tolerance-nan") { const float nan = NAN; memcpy(&node->op_params[6], &nan, sizeof(float)); }
    if (which == "fa-block-size-0")     { node->op_params[5] = 0; }
    if (which == "fa-selection-shape")  { node->op_params[5] = 16; } // the selection has words for blocks of 64
    if (which == "fa-tail-without-selection") { node->src[6] = node->src[5]; node->src[5] = nullptr; }
    if (which == "fa-heads-not-divisible") {
        // 4 query heads over 3 KV heads, the selection shaped to match: head 3 would read KV head 3
        node->src[1]->ne[2] = 3; node->src[2]->ne[2] = 3; node->src[5] = hostile;
    }
    if (which == "fa-backend-lacks")    { node->src[1]->type = GGML_TYPE_I32; } // no CPU kernel scores such keys
    ggml_backend_tensor_set(k_idxs, rows.data(), 0, ggml_nbytes(k_idxs));
    if (which == "fill-rows-rewritten-negative" || which == "fill-rows-rewritten-past-end") {
        std::vector<int64_t> bad = rows;
        bad[3] = which == "fill-rows-rewritten-negative" ? -1000 : n_kv + 100;
        ggml_backend_tensor_set(hostile, bad.data(), 0, ggml_nbytes(hostile));
    }
    if (hostile && hostile->type == GGML_TYPE_I32) {
        std::vector<int32_t> bits(ggml_nelements(hostile), -1);
        for (size_t i = 0; i < bits.size(); ++i) { if (i % hostile->ne[0] >= (size_t) hostile->ne[0] - 2) { bits[i] = (int32_t) (i*2654435761u); } }
        ggml_backend_tensor_set(hostile, bits.data(), 0, ggml_nbytes(hostile));
    }
    std::vector<float> canary_set(ggml_nelements(canary), 0.0f);
    ggml_backend_tensor_set(canary, canary_set.data(), 0, ggml_nbytes(canary));

    ggml_backend_graph_compute(backend, gf);
    std::vector<float> res(ggml_nelements(out));
    ggml_backend_tensor_get(out, res.data(), 0, ggml_nbytes(out)); // a refused graph: the read fails
    double sum = 0.0;
    for (float x : res) { sum += x; }
    std::vector<float> canary_now(ggml_nelements(canary));
    ggml_backend_tensor_get(canary, canary_now.data(), 0, ggml_nbytes(canary));
    if (memcmp(canary_now.data(), canary_set.data(), ggml_nbytes(canary)) != 0) {
        printf("CANARY %s: the server wrote outside the key bounds, into the tensor before them\n", which.c_str());
        return 3;
    }
    printf("ok %s: %zu values, sum %.6f\n", which.c_str(), res.size(), sum);

    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    ggml_backend_free(backend);
    return 0;
}
