// Probe (not built with the stack): the key sketch's scores, 16 keys at a time, from q4_0 rows (one
// row per cell, its KV heads side by side: the layout the sketch had before its tiles, with the
// select kernel's AVX-512 VNNI tile for it) against the tiles the sketch now keeps
// (ggml/src/ggml-sparse-attn-sketch.h), which compute the same integer sums and float steps, so
// the same bits (checked). A tile holds, per 16 cells, KV head and 32 dimensions, the sixteen f16
// scales and then four 64-byte rows whose 32-bit lane k holds four dimensions of key k as nibbles. 30 layers' copies, so that the scan streams from memory as a
// decode step's does; one thread; the best of 15 passes.
//
//   g++ -O3 -march=native -std=c++17 tools/probes/sketch_layout.cpp -o /tmp/sketch_layout
//   /tmp/sketch_layout 32768 && /tmp/sketch_layout 8192          (needs AVX-512 VNNI)
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <vector>
#include <random>
#include <chrono>
#include <algorithm>
struct block_q4_0 { uint16_t d; uint8_t qs[16]; };
struct block_q8_0 { uint16_t d; int8_t qs[32]; };
static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f2h(float f) { return _cvtss_sh(f, 0); }
constexpr int D = 64, NB = D/32, H = 3, G = 3;

template <int NG>
static inline void tile16_rowmajor(const char * k0, size_t nb1, const char * q8, size_t q8_row, const int32_t * q8_sums,
                                   float scale, float * sc, int64_t stride) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i halves = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    __m512 acc[NG];
    for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < NB; ++ib) {
        const size_t off = ib*sizeof(block_q4_0);
        __m512i w[8];
        for (int j = 0; j < 8; ++j) {
            const int lo = j < 4 ? j : j + 4;
            const __m128i a  = _mm_loadu_si128((const __m128i *) (k0 + lo*nb1 + off + 2));
            const __m128i b  = _mm_loadu_si128((const __m128i *) (k0 + (lo + 4)*nb1 + off + 2));
            const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
            w[j] = _mm512_and_si512(nibble, _mm512_permutex2var_epi64(_mm512_castsi256_si512(ab), halves,
                                                                      _mm512_castsi256_si512(_mm256_srli_epi16(ab, 4))));
        }
        auto dbits = [&](int i) { return (short) ((const block_q4_0 *) (k0 + i*nb1 + off))->d; };
        const __m512 dk = _mm512_cvtph_ps(_mm256_setr_epi16(
                dbits(0), dbits(1), dbits(2),  dbits(3),  dbits(4),  dbits(5),  dbits(6),  dbits(7),
                dbits(8), dbits(9), dbits(10), dbits(11), dbits(12), dbits(13), dbits(14), dbits(15)));
        for (int g = 0; g < NG; ++g) {
            const block_q8_0 * y = (const block_q8_0 *) (q8 + g*q8_row) + ib;
            const __m512i qy = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) y->qs));
            __m512i p[8];
            for (int j = 0; j < 8; ++j) p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j], qy);
            __m512i r[4];
            for (int j = 0; j < 4; ++j)
                r[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2*j], p[2*j + 1]), _mm512_unpackhi_epi32(p[2*j], p[2*j + 1]));
            const __m512i ra = _mm512_add_epi32(_mm512_unpacklo_epi64(r[0], r[1]), _mm512_unpackhi_epi64(r[0], r[1]));
            const __m512i rb = _mm512_add_epi32(_mm512_unpacklo_epi64(r[2], r[3]), _mm512_unpackhi_epi64(r[2], r[3]));
            __m512i sum = _mm512_add_epi32(_mm512_shuffle_i32x4(ra, rb, 0x88), _mm512_shuffle_i32x4(ra, rb, 0xDD));
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(q8_sums[g*NB + ib]));
            const __m512 d = _mm512_mul_ps(dk, _mm512_set1_ps(h2f(y->d)));
            acc[g] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[g]);
        }
    }
    for (int g = 0; g < NG; ++g)
        _mm512_storeu_ps(sc + g*stride, _mm512_mul_ps(_mm512_set1_ps(scale), acc[g]));
}

// transposed: per (16 keys, head, ib): 16 f16 scales, then 4 x 64 bytes; byte (m, key k, t) of
// row m holds dim 4m+t of key k in its low nibble and dim 4(m+4)+t in its high nibble
constexpr size_t TB = 32 + 256;
template <int NG>
static inline void tile16_transposed(const char * t0, const int32_t * qw, const uint16_t * qd, const int32_t * q8_sums,
                                     float scale, float * sc, int64_t stride) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512 acc[NG];
    for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < NB; ++ib) {
        const char * t = t0 + ib*TB;
        const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) t));
        __m512i w[8];
        for (int m = 0; m < 4; ++m) {
            const __m512i x = _mm512_loadu_si512(t + 32 + 64*m);
            w[m]     = _mm512_and_si512(x, nibble);
            w[m + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), nibble);
        }
        for (int g = 0; g < NG; ++g) {
            // the query's 32 dims of block ib as eight 4-byte groups; dim 4m+t in byte t of word m
            const int32_t * q = qw + (g*NB + ib)*8;
            __m512i sum = _mm512_setzero_si512();
            for (int m = 0; m < 8; ++m) sum = _mm512_dpbusd_epi32(sum, w[m], _mm512_set1_epi32(q[m]));
            sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(q8_sums[g*NB + ib]));
            const __m512 d = _mm512_mul_ps(dk, _mm512_set1_ps(h2f(qd[g*NB + ib])));
            acc[g] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sum), acc[g]);
        }
    }
    for (int g = 0; g < NG; ++g)
        _mm512_storeu_ps(sc + g*stride, _mm512_mul_ps(_mm512_set1_ps(scale), acc[g]));
}


int main(int argc, char ** argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 32768;
    std::mt19937 gen(1); std::normal_distribution<float> nd(0, 1);
    // q4_0 rows: key c, head h at c*H + h
    std::vector<block_q4_0> rows(N*H*NB);
    std::vector<float> kf(D);
    for (int64_t c = 0; c < N; ++c) for (int h = 0; h < H; ++h) {
        for (float & x : kf) x = nd(gen);
        for (int ib = 0; ib < NB; ++ib) {
            float amax = 0, mx = 0;
            for (int j = 0; j < 32; ++j) { float v = kf[ib*32 + j]; if (fabsf(v) > amax) { amax = fabsf(v); mx = v; } }
            const float d = mx / -8, id = d ? 1.0f/d : 0.0f;
            block_q4_0 & b = rows[(c*H + h)*NB + ib]; b.d = f2h(d);
            for (int j = 0; j < 16; ++j) {
                const uint8_t x0 = std::min(15, (int) (kf[ib*32 + j]*id + 8.5f));
                const uint8_t x1 = std::min(15, (int) (kf[ib*32 + 16 + j]*id + 8.5f));
                b.qs[j] = x0 | (x1 << 4);
            }
        }
    }
    // the transposed copy
    std::vector<char> tr((N/16)*H*NB*TB);
    for (int64_t c0 = 0; c0 < N; c0 += 16) for (int h = 0; h < H; ++h) for (int ib = 0; ib < NB; ++ib) {
        char * t = tr.data() + (((c0/16)*H + h)*NB + ib)*TB;
        for (int k = 0; k < 16; ++k) memcpy(t + 2*k, &rows[((c0 + k)*H + h)*NB + ib].d, 2);
        auto nib = [&](int k, int dim) { const block_q4_0 & b = rows[((c0 + k)*H + h)*NB + ib]; return dim < 16 ? b.qs[dim] & 15 : b.qs[dim - 16] >> 4; };
        for (int m = 0; m < 4; ++m) for (int k = 0; k < 16; ++k) for (int tt = 0; tt < 4; ++tt)
            t[32 + 64*m + 4*k + tt] = (char) (nib(k, 4*m + tt) | (nib(k, 4*(m + 4) + tt) << 4));
    }
    // queries as q8_0
    std::vector<block_q8_0> q8(H*G*NB); std::vector<int32_t> sums(H*G*NB);
    std::vector<int32_t> qw(H*G*NB*8); std::vector<uint16_t> qd(H*G*NB);
    for (int i = 0; i < H*G*NB; ++i) {
        float v[32], amax = 0; for (float & x : v) { x = nd(gen); amax = std::max(amax, fabsf(x)); }
        const float d = amax/127; q8[i].d = f2h(d); int s = 0;
        for (int j = 0; j < 32; ++j) { q8[i].qs[j] = (int8_t) roundf(v[j]/d); s += q8[i].qs[j]; }
        sums[i] = 8*s; qd[i] = q8[i].d;
        memcpy(&qw[i*8], q8[i].qs, 32);
    }
    const float scale = 0.125f;
    std::vector<float> a(H*G*N), b(H*G*N);
    std::vector<std::vector<block_q4_0>> rowsL(30, rows); std::vector<std::vector<char>> trL(30, tr);
    auto run_a = [&]() { for (int L = 0; L < 30; ++L) for (int64_t c0 = 0; c0 < N; c0 += 16) for (int h = 0; h < H; ++h)
        tile16_rowmajor<G>((const char *) &rowsL[L][(c0*H + h)*NB], H*NB*sizeof(block_q4_0), (const char *) &q8[h*G*NB], NB*sizeof(block_q8_0),
                           &sums[h*G*NB], scale, &a[h*G*N + c0], N); };
    auto run_b = [&]() { for (int L = 0; L < 30; ++L) for (int64_t c0 = 0; c0 < N; c0 += 16) for (int h = 0; h < H; ++h)
        tile16_transposed<G>(trL[L].data() + ((c0/16)*H + h)*NB*TB, &qw[h*G*NB*8], &qd[h*G*NB], &sums[h*G*NB], scale, &b[h*G*N + c0], N); };
    run_a(); run_b();
    printf("transposed bit-identical: %s\n", memcmp(a.data(), b.data(), a.size()*4) == 0 ? "yes" : "NO");
    double besta = 1e9, bestb = 1e9; for (int rep = 0; rep < 15; ++rep) {
        auto t0 = std::chrono::steady_clock::now(); run_a();
        auto t1 = std::chrono::steady_clock::now(); run_b();
        auto t2 = std::chrono::steady_clock::now();
        const double ma = std::chrono::duration<double, std::milli>(t1 - t0).count(), mb = std::chrono::duration<double, std::milli>(t2 - t1).count();
        besta = std::min(besta, ma); bestb = std::min(bestb, mb);
    }
    printf("%lld keys x %d KV heads x %d query heads x 30 layers, best of 15: rows %.2f ms, transposed %.2f ms (%.2fx)\n", (long long) N, H, G, besta, bestb, besta/bestb);
}
