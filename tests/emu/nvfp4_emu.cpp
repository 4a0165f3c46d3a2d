/* nvfp4_emu.cpp: host emulation of the M = 1 NVFP4 GEMV kernels' warp step
 * (src/ops/cuda/nvfp4.cuh nv4_gemv1_chunk, nv4_gemv2_chunk, nv4_gemv1t_chunk<L> and
 * their decoders) and of the lane mapping of fp4_gemv1_kernel / fp4_gemv2_kernel /
 * fp4_gemv1t_kernel (src/ops/cuda/fp4_gemv.cu:
 * the cp.async addresses, the zero rows, the scale indexing, the reductions, copied
 * here), against an fp64 product computed from the format's definition.
 *
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) is emulated from the PTX fragment layout:
 * 32 threads run the per-lane code and meet at a barrier on every mma, where lane 0
 * multiplies the gathered A (16 x 16) and B (16 x 8) fragments. bf16 multiplies round
 * to nearest even (exact for the values involved).
 *
 * The table decode's shared memory is emulated word by word: every table load checks
 * that lane i reads bank i (a conflict-free warp access), and counts a violation
 * otherwise, which fails the run like a wrong value.
 *
 * usage: nvfp4_emu [1|2|3 [L]|4 [L [M]]|5 [M]]   (1 = block-column kernel, 2 = bit-placement
 *        kernel, 3 = table-decode kernel with L = 0, 1, 2 or 4 word pairs by table, 4 = the
 *        M <= 8 table step nv4_w4_chunk_tab<L> with M tokens in the B columns, 5 = the
 *        M <= 8 bit-placement step in fp4_w4a16_async_kernel<D = 2>'s mapping, M tokens)
 * env NVFP4_EMU_MUTATE=1 swaps two scales in the lane mapping (the check must fail);
 * with kind 5, =4 leaves x in K order instead of the decode's (i, i + 4) pairing (must fail);
 * with kind 3 (and 4), =2 gives each lane its neighbour's table copy (right values, wrong
 * banks) and =3 lays the table out copy-major (word i * 256 + j): both must fail.
 * Prints one line per shape and PASS / FAIL; exit 0 on PASS. Built by
 * tests/test_nvfp4_emu.py with g++ -std=c++20 -pthread. */
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>
struct uint4 {
    uint32_t x, y, z, w;
};
static uint32_t nv4_prmt(uint32_t a, uint32_t b, uint32_t s) {
    uint8_t by[8];
    for (int i = 0; i < 4; i++) {
        by[i] = a >> (8 * i);
        by[4 + i] = b >> (8 * i);
    }
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) {
        uint32_t n = (s >> (4 * i)) & 15;
        uint8_t v = by[n & 7];
        if (n & 8)
            v = (v & 0x80) ? 0xff : 0;
        r |= (uint32_t)v << (8 * i);
    }
    return r;
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// warp mma emulation
static std::barrier<> *bar;
static uint32_t A[32][4], B[32][2];
static float C[32][4], D[32][4];
static void nv4_mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]);
static float e4m3(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7)
        return NAN;
    r = e ? ldexpf(1.f + m / 8.f, e - 7) : ldexpf(m / 8.f, -6);
    return s ? -r : r;
}
static void nv4_e4m3x2_to_f32x2(uint16_t s, float &lo, float &hi) {
    lo = e4m3(s & 0xff);
    hi = e4m3(s >> 8);
}
static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000)
        return 0x7fc0;
    u += 0x7fff + ((u >> 16) & 1);
    return u >> 16;
}
static uint32_t nv4_hmul2(uint32_t a, uint32_t b) {
    float lo = bf2f(a & 0xffff) * bf2f(b & 0xffff), hi = bf2f(a >> 16) * bf2f(b >> 16);
    return f2bf(lo) | ((uint32_t)f2bf(hi) << 16);
}
static uint32_t nv4_pack_bf16x2(float lo, float hi) { return f2bf(lo) | ((uint32_t)f2bf(hi) << 16); }
static uint32_t nv4_shr_fma(uint32_t a, uint32_t s) {
    return (uint32_t)(((uint64_t)a * (1ull << (32 - s))) >> 32);
}
// emulated shared window of the table decode: the table at TAB_ADDR (128-byte aligned)
enum { TAB_ADDR = 0x400 };
static std::vector<uint32_t> g_smem(8192 + 256);
static std::atomic<long> g_bank_bad{0};
static thread_local int my_lane;
static uint32_t nv4_lds_tab(uint32_t addr) {
    if (((addr >> 2) & 31) != (uint32_t)my_lane)
        g_bank_bad++;
    return g_smem.at((addr - TAB_ADDR) / 4);
}
static void nv4_sts_tab4(uint32_t addr, uint32_t v) {
    for (int i = 0; i < 4; i++)
        g_smem.at((addr - TAB_ADDR) / 4 + i) = v;
}
#define NV4_HOST_EMU
#include "../../src/ops/cuda/nvfp4.cuh"
static int g_mutate;
static void nv4_mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]) {
    int l = my_lane;
    for (int i = 0; i < 4; i++) {
        A[l][i] = a[i];
        C[l][i] = c[i];
    }
    B[l][0] = b0;
    B[l][1] = b1;
    bar->arrive_and_wait();
    if (l == 0) {
        float Am[16][16], Bm[16][8];
        for (int ln = 0; ln < 32; ln++) {
            int g = ln >> 2, t = ln & 3;
            auto lo = [](uint32_t v) { return bf2f(v & 0xffff); };
            auto hi = [](uint32_t v) { return bf2f(v >> 16); };
            Am[g][2 * t] = lo(A[ln][0]);
            Am[g][2 * t + 1] = hi(A[ln][0]);
            Am[g + 8][2 * t] = lo(A[ln][1]);
            Am[g + 8][2 * t + 1] = hi(A[ln][1]);
            Am[g][2 * t + 8] = lo(A[ln][2]);
            Am[g][2 * t + 9] = hi(A[ln][2]);
            Am[g + 8][2 * t + 8] = lo(A[ln][3]);
            Am[g + 8][2 * t + 9] = hi(A[ln][3]);
            Bm[2 * t][g] = lo(B[ln][0]);
            Bm[2 * t + 1][g] = hi(B[ln][0]);
            Bm[2 * t + 8][g] = lo(B[ln][1]);
            Bm[2 * t + 9][g] = hi(B[ln][1]);
        }
        for (int ln = 0; ln < 32; ln++) {
            int g = ln >> 2, t = ln & 3;
            int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
            for (int r = 0; r < 4; r++) {
                double s = C[ln][r];
                for (int k = 0; k < 16; k++)
                    s += (double)Am[rows[r]][k] * Bm[k][cols[r]];
                D[ln][r] = (float)s;
            }
        }
    }
    bar->arrive_and_wait();
    for (int i = 0; i < 4; i++)
        d[i] = D[l][i];
    bar->arrive_and_wait();
}
static float e2m1(int c) {
    static const float v[8] = {0, .5f, 1, 1.5f, 2, 3, 4, 6};
    return (c & 8 ? -1 : 1) * v[c & 7];
}

// emulate the kernel for one block (tile), warp by warp
static void run_block(int KW, int PER, int N, int K, const uint16_t *x, const uint8_t *w, const uint8_t *sc,
                      float scale2, float *y, int blk) {
    std::vector<float> red(KW * 16);
    for (int warp = 0; warp < KW; warp++) {
        // shared memory of this warp: stage[PER][2][32] uint4, xs[PER][16] uint4, ss[PER][32] u32
        std::vector<uint4> stage(PER * 64), xs(PER * 16);
        std::vector<uint32_t> ss(PER * 32);
        uint4 zb[2] = {};
        const int n0 = blk * 16, c0 = warp * PER;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, t = lane & 3;
            const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t,
                          *wr1 = wr0 + (size_t)8 * (K / 2);
            const uint16_t *xg = x + (size_t)c0 * 128 + 8 * (lane & 15);
            const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
            for (int u = 0; u < PER; u++) {
                memcpy(&stage[(u * 2 + 0) * 32 + lane], wr0 + u * 64, 16);
                memcpy(&stage[(u * 2 + 1) * 32 + lane], wr1 + u * 64, 16);
                memcpy(&ss[u * 32 + lane], sg0 + u * 8, 4);
                if (lane < 16)
                    memcpy(&xs[u * 16 + lane], xg + u * 128, 16);
            }
        }
        float accs[32][4];
        bar = new std::barrier<>(32);
        std::vector<std::thread> th;
        for (int lane = 0; lane < 32; lane++)
            th.emplace_back([&, lane] {
                my_lane = lane;
                int g = lane >> 2, t = lane & 3;
                const bool on = t == (g >> 1);
                const uint4 *pe = on && !(g & 1) ? &xs[4 * t] : zb;
                const uint4 *po = on && (g & 1) ? &xs[4 * t + 2] : zb;
                const int se = on && !(g & 1) ? 16 : 0, so = on && (g & 1) ? 16 : 0;
                const nv4_lut lut = nv4_lut_make(0);
                float acc[4] = {0, 0, 0, 0};
                for (int u = 0; u < PER; u++) {
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(&ss[u * 32]);
                    float sg[4];
                    nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
                    nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
                    if (g_mutate)
                        std::swap(sg[0], sg[1]);
                    nv4_gemv1_chunk(stage[(u * 2) * 32 + lane], stage[(u * 2 + 1) * 32 + lane], pe[u * se],
                                    pe[u * se + 1], po[u * so], po[u * so + 1], sg, lut, acc);
                }
                for (int r = 0; r < 4; r++)
                    accs[lane][r] = acc[r];
            });
        for (auto &x : th)
            x.join();
        delete bar;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2;
            red[warp * 16 + g] += accs[lane][0] + accs[lane][1];
            red[warp * 16 + g + 8] += accs[lane][2] + accs[lane][3];
        }
    }
    for (int i = 0; i < 16; i++) {
        float v = 0;
        for (int ww = 0; ww < KW; ww++)
            v += red[ww * 16 + i];
        y[blk * 16 + i] = v * scale2;
    }
}
static void run_block2(int KW, int PER, int N, int K, const uint16_t *x, const uint8_t *w, const uint8_t *sc,
                       float scale2, float *y, int blk) {
    std::vector<float> red(KW * 16);
    for (int warp = 0; warp < KW; warp++) {
        std::vector<uint4> stage(PER * 64), xs(PER * 16);
        std::vector<uint32_t> ss(PER * 32);
        const int n0 = blk * 16, c0 = warp * PER;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, t = lane & 3;
            const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t,
                          *wr1 = wr0 + (size_t)8 * (K / 2);
            const uint16_t *xg = x + (size_t)c0 * 128 + 8 * (lane & 15);
            const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
            for (int u = 0; u < PER; u++) {
                memcpy(&stage[(u * 2 + 0) * 32 + lane], wr0 + u * 64, 16);
                memcpy(&stage[(u * 2 + 1) * 32 + lane], wr1 + u * 64, 16);
                memcpy(&ss[u * 32 + lane], sg0 + u * 8, 4);
                if (lane < 16)
                    memcpy(&xs[u * 16 + lane], xg + u * 128, 16);
            }
        }
        for (int u = 0; u < PER; u++)
            for (int lane = 0; lane < 16; lane++)
                xs[u * 16 + lane] = nv4_xperm8(xs[u * 16 + lane]);
        float accs[32][4];
        bar = new std::barrier<>(32);
        std::vector<std::thread> th;
        for (int lane = 0; lane < 32; lane++)
            th.emplace_back([&, lane] {
                my_lane = lane;
                int g = lane >> 2, t = lane & 3;
                float acc[4] = {0, 0, 0, 0};
                for (int u = 0; u < PER; u++) {
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(&ss[u * 32]);
                    const uint4 xp[4] = {xs[u * 16 + 4 * t], xs[u * 16 + 4 * t + 1], xs[u * 16 + 4 * t + 2],
                                         xs[u * 16 + 4 * t + 3]};
                    uint16_t sa = s16[4 * g + t], sb = s16[4 * (g + 8) + t];
                    if (g_mutate)
                        std::swap(sa, sb);
                    nv4_gemv2_chunk(stage[(u * 2) * 32 + lane], stage[(u * 2 + 1) * 32 + lane], sa, sb, xp,
                                    acc);
                }
                for (int r = 0; r < 4; r++)
                    accs[lane][r] = acc[r];
            });
        for (auto &x : th)
            x.join();
        delete bar;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, t = lane & 3;
            if (t == 0) {
                red[warp * 16 + g] = accs[lane][0];
                red[warp * 16 + g + 8] = accs[lane][2];
            }
        }
    }
    for (int i = 0; i < 16; i++) {
        float v = 0;
        for (int ww = 0; ww < KW; ww++)
            v += red[ww * 16 + i];
        y[blk * 16 + i] = v * scale2 * 256.f;
    }
}
// the table-decode kernel (fp4_gemv1t_kernel): fp4_gemv1_kernel's staging, the table,
// one 32-byte x read per lane and chunk
template <int L>
static void run_block3(int KW, int PER, int N, int K, const uint16_t *x, const uint8_t *w, const uint8_t *sc,
                       float scale2, float *y, int blk) {
    std::vector<float> red(KW * 16);
    const nv4_lut lut0 = nv4_lut_make(0);
    if (g_mutate == 3) { // copy-major layout: a wrong bank mapping whose values differ
        for (int i = 0; i < 32; i++)
            for (int j = 0; j < 256; j++)
                g_smem[i * 256 + j] = nv4_tab_entry(j, lut0);
    } else {
        for (int tid = 0; tid < 32 * KW; tid++)
            nv4_tab_build(TAB_ADDR, tid, 32 * KW, lut0);
    }
    for (int warp = 0; warp < KW; warp++) {
        std::vector<uint4> stage(PER * 64), xs(PER * 16);
        std::vector<uint32_t> ss(PER * 32);
        uint4 zb[2] = {};
        const int n0 = blk * 16, c0 = warp * PER;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, t = lane & 3;
            const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t,
                          *wr1 = wr0 + (size_t)8 * (K / 2);
            const uint16_t *xg = x + (size_t)c0 * 128 + 8 * (lane & 15);
            const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
            for (int u = 0; u < PER; u++) {
                memcpy(&stage[(u * 2 + 0) * 32 + lane], wr0 + u * 64, 16);
                memcpy(&stage[(u * 2 + 1) * 32 + lane], wr1 + u * 64, 16);
                memcpy(&ss[u * 32 + lane], sg0 + u * 8, 4);
                if (lane < 16)
                    memcpy(&xs[u * 16 + lane], xg + u * 128, 16);
            }
        }
        float accs[32][4];
        bar = new std::barrier<>(32);
        std::vector<std::thread> th;
        for (int lane = 0; lane < 32; lane++)
            th.emplace_back([&, lane] {
                my_lane = lane;
                int g = lane >> 2, t = lane & 3;
                const bool on = t == (g >> 1);
                const uint4 *px = on ? &xs[4 * t + 2 * (g & 1)] : zb;
                const int sx = on ? 16 : 0;
                const uint32_t tl = TAB_ADDR + 4u * (uint32_t)(g_mutate == 2 ? lane ^ 1 : lane);
                const nv4_lut lut = nv4_lut_make(0);
                float acc[4] = {0, 0, 0, 0};
                for (int u = 0; u < PER; u++) {
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(&ss[u * 32]);
                    float sg[4];
                    nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
                    nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
                    if (g_mutate == 1)
                        std::swap(sg[0], sg[1]);
                    nv4_gemv1t_chunk<L>(stage[(u * 2) * 32 + lane], stage[(u * 2 + 1) * 32 + lane], px[u * sx],
                                        px[u * sx + 1], sg, lut, tl, acc);
                }
                for (int r = 0; r < 4; r++)
                    accs[lane][r] = acc[r];
            });
        for (auto &x : th)
            x.join();
        delete bar;
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2;
            red[warp * 16 + g] += accs[lane][0] + accs[lane][1];
            red[warp * 16 + g + 8] += accs[lane][2] + accs[lane][3];
        }
    }
    for (int i = 0; i < 16; i++) {
        float v = 0;
        for (int ww = 0; ww < KW; ww++)
            v += red[ww * 16 + i];
        y[blk * 16 + i] = v * scale2;
    }
}
// the M <= 8 table step (nv4_w4_chunk_tab<L>) in fp4_w4a16_async_kernel's mapping:
// lane (g, t) feeds token column g (rows clamped to M - 1), outputs c0, c1 = row g,
// tokens 2t, 2t + 1; c2, c3 = row g + 8
template <int L>
static void run_block4(int KW, int PER, int M, int N, int K, const uint16_t *x, const uint8_t *w,
                       const uint8_t *sc, float scale2, float *y, int blk) {
    std::vector<float> red(KW * 4 * 32);
    const nv4_lut lut0 = nv4_lut_make(0);
    for (int tid = 0; tid < 32 * KW; tid++)
        nv4_tab_build(TAB_ADDR, tid, 32 * KW, lut0);
    for (int warp = 0; warp < KW; warp++) {
        const int n0 = blk * 16, c0 = warp * PER;
        float accs[32][4];
        bar = new std::barrier<>(32);
        std::vector<std::thread> th;
        for (int lane = 0; lane < 32; lane++)
            th.emplace_back([&, lane] {
                my_lane = lane;
                int g = lane >> 2, t = lane & 3;
                const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t,
                              *wr1 = wr0 + (size_t)8 * (K / 2);
                const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + c0 * 8 + 2 * t,
                              *sr1 = sr0 + (size_t)8 * (K / 16);
                const int m = g < M ? g : M - 1;
                const uint32_t tl = TAB_ADDR + 4u * (uint32_t)(g_mutate == 2 ? lane ^ 1 : lane);
                const nv4_lut lut = nv4_lut_make(0);
                float acc[4] = {0, 0, 0, 0};
                for (int u = 0; u < PER; u++) {
                    uint4 w0, w1, xv[4];
                    uint16_t s0, s1;
                    memcpy(&w0, wr0 + u * 64, 16);
                    memcpy(&w1, wr1 + u * 64, 16);
                    memcpy(&s0, sr0 + u * 8, 2);
                    memcpy(&s1, sr1 + u * 8, 2);
                    if (g_mutate == 1)
                        std::swap(s0, s1);
                    for (int v = 0; v < 4; v++)
                        memcpy(&xv[v], x + (size_t)m * K + (c0 + u) * 128 + 32 * t + 8 * v, 16);
                    nv4_w4_chunk_tab<L>(w0, w1, s0, s1, xv, lut, tl, acc);
                }
                for (int r = 0; r < 4; r++)
                    accs[lane][r] = acc[r];
            });
        for (auto &x : th)
            x.join();
        delete bar;
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++)
                red[(warp * 4 + r) * 32 + lane] = accs[lane][r];
    }
    for (int el = 0; el < 4; el++)
        for (int l = 0; l < 32; l++) {
            int mo = 2 * (l & 3) + (el & 1), n = blk * 16 + (l >> 2) + (el >= 2 ? 8 : 0);
            if (mo >= M)
                continue;
            float v = 0;
            for (int ww = 0; ww < KW; ww++)
                v += red[(ww * 4 + el) * 32 + l];
            y[(size_t)mo * N + n] = v * scale2;
        }
}
// the M <= 8 bit-placement step (nv4_gemv2_chunk) in fp4_w4a16_async_kernel<D = 2>'s
// mapping: fp4_w4a16_async_kernel's lanes and columns (as run_block4), x of token column g
// permuted per 8 values by nv4_xperm8 in registers, the sums times 2^8 · scale2
static void run_block5(int KW, int PER, int M, int N, int K, const uint16_t *x, const uint8_t *w,
                       const uint8_t *sc, float scale2, float *y, int blk) {
    std::vector<float> red(KW * 4 * 32);
    for (int warp = 0; warp < KW; warp++) {
        const int n0 = blk * 16, c0 = warp * PER;
        float accs[32][4];
        bar = new std::barrier<>(32);
        std::vector<std::thread> th;
        for (int lane = 0; lane < 32; lane++)
            th.emplace_back([&, lane] {
                my_lane = lane;
                int g = lane >> 2, t = lane & 3;
                const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t,
                              *wr1 = wr0 + (size_t)8 * (K / 2);
                const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + c0 * 8 + 2 * t,
                              *sr1 = sr0 + (size_t)8 * (K / 16);
                const int m = g < M ? g : M - 1;
                float acc[4] = {0, 0, 0, 0};
                for (int u = 0; u < PER; u++) {
                    uint4 w0, w1, xv[4];
                    uint16_t s0, s1;
                    memcpy(&w0, wr0 + u * 64, 16);
                    memcpy(&w1, wr1 + u * 64, 16);
                    memcpy(&s0, sr0 + u * 8, 2);
                    memcpy(&s1, sr1 + u * 8, 2);
                    if (g_mutate == 1)
                        std::swap(s0, s1);
                    for (int v = 0; v < 4; v++)
                        memcpy(&xv[v], x + (size_t)m * K + (c0 + u) * 128 + 32 * t + 8 * v, 16);
                    uint4 xp[4];
                    for (int v = 0; v < 4; v++)
                        xp[v] = g_mutate == 4 ? xv[v] : nv4_xperm8(xv[v]); /* 4: x left in K order */
                    nv4_gemv2_chunk(w0, w1, s0, s1, xp, acc);
                }
                for (int r = 0; r < 4; r++)
                    accs[lane][r] = acc[r];
            });
        for (auto &x : th)
            x.join();
        delete bar;
        for (int lane = 0; lane < 32; lane++)
            for (int r = 0; r < 4; r++)
                red[(warp * 4 + r) * 32 + lane] = accs[lane][r];
    }
    for (int el = 0; el < 4; el++)
        for (int l = 0; l < 32; l++) {
            int mo = 2 * (l & 3) + (el & 1), n = blk * 16 + (l >> 2) + (el >= 2 ? 8 : 0);
            if (mo >= M)
                continue;
            float v = 0;
            for (int ww = 0; ww < KW; ww++)
                v += red[(ww * 4 + el) * 32 + l];
            y[(size_t)mo * N + n] = v * (scale2 * 256.f);
        }
}
int main(int argc, char **argv) {
    const int kind = argc > 1 ? atoi(argv[1]) : 1;
    const int L = argc > 2 ? atoi(argv[2]) : 4;
    const int MT = kind == 4 ? (argc > 3 ? atoi(argv[3]) : 8) : kind == 5 ? L : 1; /* tokens (kinds 4, 5) */
    if (MT < 1 || MT > 8) {
        printf("bad M %d\n", MT);
        return 1;
    }
    if ((kind == 3 || kind == 4) && L != 1 && L != 2 && L != 4 && !(kind == 3 && L == 0)) {
        printf("bad L %d\n", L);
        return 1;
    }
    g_mutate = getenv("NVFP4_EMU_MUTATE") ? atoi(getenv("NVFP4_EMU_MUTATE")) : 0;
    std::mt19937 rng(1);
    int cfg[][4] = {
        {4096, 256, 16, 2}, {4096, 48, 8, 4}, {1024, 32, 8, 1}, {512, 16, 4, 1}, {2048, 32, 4, 4}};
    int bad = 0;
    for (auto &c : cfg) {
        int K = c[0], N = c[1], KW = c[2], PER = c[3];
        if (K != KW * PER * 128) {
            printf("bad cfg\n");
            return 1;
        }
        std::vector<uint16_t> x((size_t)K * MT);
        std::vector<uint8_t> w((size_t)N * K / 2), sc((size_t)N * K / 16);
        for (auto &v : x) {
            float f = std::uniform_real_distribution<float>(-2, 2)(rng);
            uint32_t u;
            memcpy(&u, &f, 4);
            v = u >> 16;
        }
        for (auto &v : w)
            v = rng() & 0xff;
        for (auto &v : sc) {
            v = rng() & 0x7f;
            if ((v & 0x7f) == 0x7f)
                v = 0x7e;
            if (rng() % 16 == 0)
                v = rng() % 8;
        }
        float scale2 = 0.37f;
        std::vector<float> y((size_t)N * MT);
        for (int b = 0; b < N / 16; b++)
            if (kind == 5)
                run_block5(KW, PER, MT, N, K, x.data(), w.data(), sc.data(), scale2, y.data(), b);
            else if (kind == 4)
                (L == 1 ? run_block4<1> : L == 2 ? run_block4<2> : run_block4<4>)(KW, PER, MT, N, K, x.data(), w.data(),
                                                                                 sc.data(), scale2, y.data(), b);
            else
                (kind == 3   ? (L == 0 ? run_block3<0> : L == 1 ? run_block3<1> : L == 2 ? run_block3<2> : run_block3<4>)
                 : kind == 2 ? run_block2
                             : run_block)(KW, PER, N, K, x.data(), w.data(), sc.data(), scale2, y.data(), b);
        double maxerr = 0, maxref = 0;
        for (int m = 0; m < MT; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    uint8_t byte = w[(size_t)n * K / 2 + k / 2];
                    int code = k & 1 ? byte >> 4 : byte & 15;
                    s += (double)e2m1(code) * e4m3(sc[(size_t)n * K / 16 + k / 16]) * bf2f(x[(size_t)m * K + k]);
                }
                s *= scale2;
                maxerr = fmax(maxerr, fabs(s - y[(size_t)m * N + n]));
                maxref = fmax(maxref, fabs(s));
            }
        printf("K=%d N=%d KW=%d PER=%d: max|err| %.3g max|ref| %.3g rel %.3g\n", K, N, KW, PER, maxerr,
               maxref, maxerr / maxref);
        if (maxerr / maxref > 1e-5)
            bad = 1;
    }
    // decode check: all 256 bytes -> compare
    nv4_lut lut = nv4_lut_make(0);
    for (uint32_t v = 0; v < 65536; v += 1) {
        uint32_t wv = v * 0x9E3779B1u;
        uint32_t out[4];
        nv4_e2m1x8_to_bf16x8(wv, lut, out);
        for (int j = 0; j < 8; j++) {
            float want = e2m1((wv >> (4 * j)) & 15);
            float got = j & 1 ? bf2f(out[j / 2] >> 16) : bf2f(out[j / 2] & 0xffff);
            if (want != got || std::signbit(want) != std::signbit(got)) {
                printf("decode mismatch %08x %d\n", wv, j);
                bad = 1;
                break;
            }
        }
    }
    for (uint32_t v = 0; v < 65536; v++) {
        uint32_t wv = v * 0x9E3779B1u;
        uint32_t out[4];
        nv4_e2m1x8_place(wv, out);
        for (int j = 0; j < 8; j++) {
            float want = e2m1((wv >> (4 * j)) & 15) * ldexpf(1.f, -126);
            uint32_t o = out[j & 3];
            float got = j < 4 ? bf2f(o & 0xffff) : bf2f(o >> 16);
            if (want != got || std::signbit(want) != std::signbit(got)) {
                printf("place mismatch %08x %d %g %g\n", wv, j, want, got);
                bad = 1;
                break;
            }
        }
    }
    if (kind == 3 || kind == 4) { // the table decode of every byte in every lane's copy, word by word
        nv4_lut lut0 = nv4_lut_make(0);
        for (int tid = 0; tid < 256; tid++)
            nv4_tab_build(TAB_ADDR, tid, 256, lut0);
        for (int lane = 0; lane < 32 && !bad; lane++) {
            my_lane = lane;
            for (uint32_t v = 0; v < 4096; v++) {
                uint32_t wv = v * 0x9E3779B1u + lane, out[4];
                nv4_tab_decode4(wv, TAB_ADDR + 4u * lane, out);
                for (int j = 0; j < 8; j++) {
                    float want = e2m1((wv >> (4 * j)) & 15);
                    float got = j & 1 ? bf2f(out[j / 2] >> 16) : bf2f(out[j / 2] & 0xffff);
                    if (want != got || std::signbit(want) != std::signbit(got)) {
                        printf("table decode mismatch lane %d %08x %d\n", lane, wv, j);
                        bad = 1;
                        break;
                    }
                }
                if (bad)
                    break;
            }
        }
        my_lane = 0;
        printf("table loads off their lane's bank: %ld\n", g_bank_bad.load());
        if (g_bank_bad.load())
            bad = 1;
    }
    printf(bad ? "FAIL\n" : "PASS\n");
    return bad;
}
