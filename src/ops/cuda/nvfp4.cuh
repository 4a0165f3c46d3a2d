/* nvfp4.cuh: NVFP4 (ModelOpt) weight decoding and the M = 1 "block-column"
 * GEMV step on mma.sync, as self-contained device functions (no laststand
 * headers needed: include it from any .cu file).
 *
 * Weight layout (the checkpoint's, never repacked): codes uint8 [N, K/2],
 * element 2i in the low nibble of byte i; E4M3 block scales [N, K/16]; one
 * fp32 scale2. W[n,k] = e2m1(code) · e4m3(scale[n, k/16]) · scale2.
 *
 * The GEMV step (nv4_gemv1_chunk). A warp owns a 16-row tile; in one step it
 * consumes 128 K elements ("a chunk": 64 bytes of codes and 8 scales per row).
 * Lane (g = lane / 4, t = lane % 4) holds 16 bytes of codes of rows g and
 * g + 8 (chunk bytes 16t .. 16t + 15 = blocks 2t and 2t + 1, 32 elements),
 * decoded exactly into BF16 E2M1 values (no scale) and fed to mma.sync
 * m16n8k16 as the 16-row A operand; K is permuted inside each lane's slice
 * identically for A and B (a dot product does not care about order).
 * The 8 columns of B do not hold 8 tokens: column c holds the token's x only
 * on the K positions of block c of the chunk (slot t = c / 2, half c % 2) and
 * zeros elsewhere. So D[row, c] is the unscaled partial dot product of block
 * c alone, and the lane that receives D[g, 2t], D[g, 2t + 1], D[g + 8, 2t],
 * D[g + 8, 2t + 1] is exactly the lane that loaded the scales of those four
 * (row, block) pairs: the block scale becomes one fp32 FFMA per output,
 * acc += s · D, instead of a BF16 multiply per decoded pair of weights.
 * In B, lane (g, t) supplies column g at slot t: the x values of its block if
 * t == g / 2 (half g % 2), else zeros. Per chunk per lane: 8 HMMA, 4 FFMA,
 * 8 x 15 integer ops of decode, 2 scale conversions. M = 1 only (the columns
 * are spent on blocks, not tokens).
 *
 * Exactness: E2M1 values are BF16 values (normal, so no subnormal goes into
 * the tensor core); products with BF16 x are exact in fp32; the accumulation
 * is fp32 (the tensor core's), then fp32 scale FFMAs. Same error class as a
 * dequantize-to-BF16 GEMM with fp32 accumulation.
 *
 * A second chunk step, nv4_gemv2_chunk, decodes by bit placement instead (half the
 * decode on the FMA pipe, see nv4_e2m1x8_place) and applies the scale to A with one
 * BF16 multiply per pair: up to 8 tokens in the B columns (fp4_gemv.cu's default on
 * the large weights at M = 1 and at M = 2..8). It is nv4_w4_chunk<Dec>, the scaled-A
 * step generic in its decoder, with nv4_dec_place.
 *
 * A third one, nv4_gemv1t_chunk<L>, is nv4_gemv1_chunk with L of its 4 word pairs
 * decoded through a shared-memory table instead of byte permutes (see "table decode"
 * below): per code byte an address from the byte (PRMT + IMAD, or IMADs alone) and one
 * LDS.32 that is conflict-free whatever the codes, moving decode work from the integer
 * pipe to the MIO (shared-memory) pipe. On the H200 it does not pay in the GEMV: L = 2
 * was within a few percent of the byte permutes and slower than L = 0, whose halved x
 * reads (below) are the measured gain; L = 4 makes the MIO pipe the busier one
 * (bench/RESULTS.md). nv4_w4_chunk_tab<L> is the same decode in the scaled-A form with
 * tokens in the B columns (M <= 8); nv4_tab_build / nv4_tab_decode4 serve any kernel.
 *
 * For a host-side emulation (a test) define NV4_HOST_EMU and provide uint4,
 * nv4_prmt, nv4_mma_16816, nv4_e4m3x2_to_f32x2, nv4_hmul2, nv4_pack_bf16x2,
 * nv4_shr_fma, nv4_lds_tab and nv4_sts_tab4 before including this file.
 */
#ifndef LS_NVFP4_CUH
#define LS_NVFP4_CUH

#ifndef NV4_HOST_EMU
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#define NV4_FN __device__ __forceinline__
#define NV4_MFN __device__ __forceinline__ /* member functions */

/* __byte_perm: d.byte[i] = ({b,a} as 8 bytes)[sel nibble i] (sel bit 3 of a nibble = sign replicate) */
NV4_FN uint32_t nv4_prmt(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }

/* D = A·B + C, m16n8k16, BF16 in, fp32 accumulate (A row-major, B col-major). */
NV4_FN void nv4_mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const float c[4]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

/* cp.async of 4 bytes (cached in L1 and L2): for the block scales, which must be
 * in flight with the weights (a plain load of them is sunk by the compiler to its
 * first use, behind the waits, and its DRAM latency paid after the weights). */
NV4_FN void nv4_cp_async4(void *smem, const void *gmem) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(sa), "l"(gmem));
}

/* BF16x2 multiply (HMUL2 on the FMA pipe; subnormal inputs are not flushed). */
NV4_FN uint32_t nv4_hmul2(uint32_t a, uint32_t b) {
    __nv_bfloat162 r = __hmul2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* Two floats -> bf16x2 (round to nearest; exact for the values used here). */
NV4_FN uint32_t nv4_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&r);
}

/* a >> s for a constant s, as the high word of a multiply (IMAD.HI, FMA-heavy pipe)
 * instead of SHF (integer ALU pipe, the decode's bottleneck). */
NV4_FN uint32_t nv4_shr_fma(uint32_t a, uint32_t s) { return __umulhi(a, 1u << (32 - s)); }

/* Two E4M3 bytes (low byte first) -> two exact floats (one cvt to f16x2, then f16 -> f32). */
NV4_FN void nv4_e4m3x2_to_f32x2(uint16_t s, float &lo, float &hi) {
    uint32_t h2;
    asm("{cvt.rn.f16x2.e4m3x2 %0, %1;}\n" : "=r"(h2) : "h"(s));
    __half2 hh = *reinterpret_cast<__half2 *>(&h2);
    float2 f = __half22float2(hh);
    lo = f.x;
    hi = f.y;
}

/* 32-bit load / 16-byte store at a shared-window address (the table decode). */
NV4_FN uint32_t nv4_lds_tab(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
NV4_FN void nv4_sts_tab4(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(v));
}
#else
#define NV4_FN static inline
#define NV4_MFN inline
#endif

/* The two byte tables of nv4_e2m1x8_to_bf16x8 that prmt needs in registers (the
 * other two are immediates). Built once per thread from a value the compiler
 * cannot fold (zero = any runtime zero, e.g. a kernel argument known to be 0 or
 * (int)(n < 0) for n >= 0): ptxas otherwise re-materializes them from uniform
 * registers before every prmt, one extra instruction per table use. */
struct nv4_lut {
    uint32_t l0, h0;
};
NV4_FN nv4_lut nv4_lut_make(uint32_t zero) {
    nv4_lut l;
    l.l0 = 0xC0800000u | zero; /* low bytes  for magnitude index 0..3 */
    l.h0 = 0x3F3F3F00u | zero; /* high bytes for magnitude index 0..3 */
    return l;
}

/* Eight E2M1 codes in one 32-bit word (code i in bits 4i..4i+3, the checkpoint's
 * byte order) -> four bf16x2 words, out[j] = (code 2j low half, code 2j+1 high
 * half), exact. Byte permutes: the BF16 of |v| has high byte H[i] and low byte
 * L[i] for magnitude index i (0, .5, 1, 1.5, 2, 3, 4, 6 -> 0000 3F00 3F80 3FC0
 * 4000 4040 4080 40C0); each code's sign moves to bit 15 of its half. 16 ops. */
NV4_FN void nv4_e2m1x8_to_bf16x8(uint32_t w, const nv4_lut &lut, uint32_t out[4]) {
    const uint32_t L1 = 0xC0804000u, H1 = 0x40404040u; /* low / high bytes for index 4..7 */
    const uint32_t t = w << 4;                          /* sign of even codes at bit 7 of each byte */
    const uint32_t sh[2] = {w & 0x7777u, (w >> 16) & 0x7777u}; /* 3-bit magnitude indices */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t lo = nv4_prmt(lut.l0, L1, sh[h]);
        uint32_t hi = nv4_prmt(lut.h0, H1, sh[h]);
        uint32_t s = nv4_prmt(t, w, h == 0 ? 0x5140u : 0x7362u); /* signs of codes 4h..4h+3 at bit 7 of bytes 0..3 */
        hi |= s & 0x80808080u;
        out[2 * h + 0] = nv4_prmt(lo, hi, 0x5140u);
        out[2 * h + 1] = nv4_prmt(lo, hi, 0x7362u);
    }
}

/* One 128-element chunk of a 16-row tile against one token, block-column form
 * (see the top of this file). w0 / w1: this lane's 16 B of codes of rows g and
 * g + 8. xe0, xe1: the x values (BF16, K order) of the first half of the lane's
 * 32-element slice (xe0 = elements 0..7, xe1 = 8..15) if t == g / 2 and g is
 * even, else zeros; xo0, xo1: the second half (16..31) if t == g / 2 and g is
 * odd, else zeros. s0 / s1: the E4M3 scales of blocks 2t, 2t + 1 (low byte
 * first) of rows g / g + 8 as floats: sg[0], sg[1] (row g), sg[2], sg[3]
 * (row g + 8). acc[0..3] += scale · partial of (row g, block 2t), (g, 2t + 1),
 * (g + 8, 2t), (g + 8, 2t + 1). The row sums are acc[0] + acc[1] (row g) and
 * acc[2] + acc[3] (row g + 8), summed over the four lanes t of a group and
 * over chunks. */
NV4_FN void nv4_gemv1_chunk(uint4 w0, uint4 w1, uint4 xe0, uint4 xe1, uint4 xo0, uint4 xo1, const float sg[4],
                            const nv4_lut &lut, float acc[4]) {
    const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
    const uint4 xv[4] = {xe0, xe1, xo0, xo1};
    const float z[4] = {0.f, 0.f, 0.f, 0.f};
    float de[4], dO[4]; /* even columns come from words 0, 1; odd ones from words 2, 3 */
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a0[4], a1[4];
        nv4_e2m1x8_to_bf16x8(q0[q], lut, a0);
        nv4_e2m1x8_to_bf16x8(q1[q], lut, a1);
        const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]}, f1[4] = {a0[2], a1[2], a0[3], a1[3]};
        float *d = q < 2 ? de : dO;
        nv4_mma_16816(d, f0, xv[q].x, xv[q].y, (q & 1) ? d : z);
        nv4_mma_16816(d, f1, xv[q].z, xv[q].w, d);
    }
    acc[0] += sg[0] * de[0];
    acc[1] += sg[1] * dO[1];
    acc[2] += sg[2] * de[2];
    acc[3] += sg[3] * dO[3];
}

/* ---- bit-placement decode (balanced between the integer and FMA pipes) -------

   nv4_e2m1x8_place: eight codes (code i in bits 4i..4i+3) -> four bf16x2 words,
   out[i] = (code i low half, code i + 4 high half), each equal to e2m1 x 2^-126
   exactly: the code's magnitude bits go to BF16 bits 6..8 (exponent bits 7, 8 =
   E2M1's exponent, bit 6 = its mantissa; E2M1's subnormal 0.5 becomes the BF16
   subnormal 2^-127) and its sign to bit 15. Per word: 7 shifts written as
   multiplies (IMAD.SHL / IMAD.HI: FMA-heavy pipe) and 8 LOP3 (integer pipe),
   against 16 integer-pipe instructions for nv4_e2m1x8_to_bf16x8. The 2^-126 (and
   the subnormal) must leave through a BF16 multiply before the tensor core:
   nv4_gemv2_chunk multiplies by the block scale x 2^118 (exact: E2M1 x E4M3 has
   at most 6 significant bits; the result e2m1 x scale x 2^-8 >= 2^-18 is normal).
   The pairing (i, i + 4) needs x in the same order: nv4_xperm8. */
NV4_FN void nv4_e2m1x8_place(uint32_t q, uint32_t out[4]) {
    const uint32_t S = 0x80008000u, M = 0x01C001C0u;
    out[3] = (q & S) | (nv4_shr_fma(q, 6) & M);
    out[2] = ((q * 16u) & S) | (nv4_shr_fma(q, 2) & M);
    out[1] = ((q * 256u) & S) | ((q * 4u) & M);
    out[0] = ((q * 4096u) & S) | ((q * 64u) & M);
}

/* Eight BF16 x values in K order (a uint4 as loaded) -> the (i, i + 4) pairing of
 * nv4_e2m1x8_place: {(x0, x4), (x1, x5), (x2, x6), (x3, x7)}. */
NV4_FN uint4 nv4_xperm8(uint4 v) {
    uint4 r;
    r.x = nv4_prmt(v.x, v.z, 0x5410u);
    r.y = nv4_prmt(v.x, v.z, 0x7632u);
    r.z = nv4_prmt(v.y, v.w, 0x5410u);
    r.w = nv4_prmt(v.y, v.w, 0x7632u);
    return r;
}

/* The two E4M3 scales of a uint16 (low byte first) as bf16x2 pairs (s x 2^118, same)
 * for nv4_gemv2_chunk: exact (448 x 2^118 < 2^127). */
NV4_FN void nv4_scale2_bf16x2_x118(uint16_t s, uint32_t &lo, uint32_t &hi) {
    float a, b;
    nv4_e4m3x2_to_f32x2(s, a, b);
    const float k = 0x1p118f;
    lo = nv4_pack_bf16x2(a * k, a * k);
    hi = nv4_pack_bf16x2(b * k, b * k);
}

/* The scaled-A chunk step, generic in its decoder (the tokens in the B columns, up to
 * 8, as cu_w4_chunk_mma in cu_util.h, which moe.cu uses with the byte-permute decode):
 * one 128-element chunk of a 16-row tile. w0 / w1 = this lane's 16 B of codes of rows
 * g and g + 8 (blocks 2t, 2t + 1 of the chunk), s0 / s1 their E4M3 scales (low byte
 * first), xv[q] = the lane's x for its token column g, elements 8q .. 8q + 7 of its
 * 32-element slice, in the order dec.decode pairs the codes. Each decoded pair is
 * multiplied by its block scale (one HMUL2, exact: E2M1 x E4M3 has at most 6
 * significant bits). acc: c0, c1 = row g, tokens 2t, 2t + 1; c2, c3 = row g + 8.
 * Dec provides
 *   scales(s, lo, hi): the two E4M3 scales of s as bf16x2 pairs (times the
 *                      decoder's constant factor, if any);
 *   decode(q, w, out): word q (0..3) of the lane's 16 bytes -> four bf16x2. */
template <class Dec>
NV4_FN void nv4_w4_chunk(const Dec &dec, uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 (&xv)[4],
                         float acc[4]) {
    uint32_t sa0, sb0, sa1, sb1;
    dec.scales(s0, sa0, sb0);
    dec.scales(s1, sa1, sb1);
    const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a0[4], a1[4];
        dec.decode(q, q0[q], a0);
        dec.decode(q, q1[q], a1);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            a0[r] = nv4_hmul2(a0[r], q < 2 ? sa0 : sb0);
            a1[r] = nv4_hmul2(a1[r], q < 2 ? sa1 : sb1);
        }
        const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]}, f1[4] = {a0[2], a1[2], a0[3], a1[3]};
        nv4_mma_16816(acc, f0, xv[q].x, xv[q].y, acc);
        nv4_mma_16816(acc, f1, xv[q].z, xv[q].w, acc);
    }
}

/* The bit-placement decoder of nv4_w4_chunk: values x 2^-126, scales x 2^118, x in the
 * (i, i + 4) pairing (nv4_xperm8); the products carry 2^-8. */
struct nv4_dec_place {
    NV4_MFN void scales(uint16_t s, uint32_t &lo, uint32_t &hi) const { nv4_scale2_bf16x2_x118(s, lo, hi); }
    NV4_MFN void decode(int, uint32_t w, uint32_t out[4]) const { nv4_e2m1x8_place(w, out); }
};

/* One 128-element chunk by bit placement (fp4_gemv2_kernel): nv4_w4_chunk with
 * nv4_dec_place; xp[q] permuted by nv4_xperm8; multiply the sums by 2^8 · scale2. */
NV4_FN void nv4_gemv2_chunk(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 (&xp)[4], float acc[4]) {
    nv4_w4_chunk(nv4_dec_place{}, w0, w1, s0, s1, xp, acc);
}

/* ---- table decode (shared-memory lookup, conflict-free) ------------------------

   The table maps a code byte b to the bf16x2 word (e2m1(b & 15) low half, e2m1(b >> 4)
   high half), exact and unscaled: the same word nv4_e2m1x8_to_bf16x8 produces for that
   byte. 256 entries x 4 B, replicated 32 times so that lane i's copy lives entirely in
   bank i: entry j of copy i is word j * 32 + i of the table (32 KB; the table must
   start 128-byte aligned in the shared window for the bank mapping; a misaligned one
   stays correct, only slower). Every LDS.32 of a warp then touches 32 distinct banks
   whatever the codes: one wavefront. Lane i reads at (table + 4 i) + 128 b. */
enum { NV4_TAB_BYTES = 256 * 32 * 4 };

/* The entry of byte b (b < 256). */
NV4_FN uint32_t nv4_tab_entry(uint32_t b, const nv4_lut &lut) {
    uint32_t out[4];
    nv4_e2m1x8_to_bf16x8(b, lut, out);
    return out[0];
}

/* Fill the table at shared address tab (NV4_TAB_BYTES, 128-byte aligned) by the
 * nthreads threads of a block, thread tid: 16-byte stores of 4 lanes' copies of one
 * entry (2048 of them, 8 per thread at 256 threads). The caller syncs the block. */
NV4_FN void nv4_tab_build(uint32_t tab, int tid, int nthreads, const nv4_lut &lut) {
    for (int i = tid; i < NV4_TAB_BYTES / 16; i += nthreads)
        nv4_sts_tab4(tab + 16u * (uint32_t)i, nv4_tab_entry((uint32_t)i >> 3, lut));
}

/* Eight codes in one word (the checkpoint's order) -> four bf16x2 words, the same
 * output as nv4_e2m1x8_to_bf16x8, through the table: tl = this lane's copy (table +
 * 4 * lane). The address of byte k is tl + 128 b_k: bytes 1 and 2 by PRMT (zero-
 * extended byte, integer pipe) and IMAD; bytes 0 and 3 on the FMA pipe alone, as
 * multiplies ((w << 24) >> 17 = 128 b_0: IMAD.SHL, IMAD.HI with the add; w >> 24:
 * IMAD.HI, then IMAD): 2 integer-pipe ops per word instead of 4. Then one LDS.32 each. */
NV4_FN void nv4_tab_decode4(uint32_t w, uint32_t tl, uint32_t out[4]) {
    out[0] = nv4_lds_tab(nv4_shr_fma(w * 16777216u, 17) + tl);
    out[1] = nv4_lds_tab(tl + 128u * nv4_prmt(w, 0u, 0x4441u));
    out[2] = nv4_lds_tab(tl + 128u * nv4_prmt(w, 0u, 0x4442u));
    out[3] = nv4_lds_tab(tl + 128u * nv4_shr_fma(w, 24));
}

/* nv4_gemv1_chunk with the word pairs q in the mask NV4_TAB_Q(L) decoded through the
 * table (L = 0: none; 1: q 0; 2: q 0, 2; 3: q 0, 1, 2; 4: all) and the others by byte
 * permutes: the table moves decode from the integer pipe (8 x 16 ops per chunk) to
 * the MIO pipe (8 LDS.32 per word pair, one wavefront each), and the two pipes
 * balance near L = 2 (bench/RESULTS.md). The B columns take the lane's 32 bytes of
 * x (x0: slice elements 0..7 / 16..23, x1: 8..15 / 24..31 of its half, or zeros when
 * t != g / 2) for both halves: column 2t of the first two mma pairs and column 2t + 1
 * of the last two are the ones read (de[0], de[2], dO[1], dO[3]); the other columns
 * pair a block's codes with the other block's x and are never used. So a lane reads
 * 32 B of x per chunk instead of 64 (nv4_gemv1_chunk's xe / xo, half of them zeros).
 * sg, acc: as nv4_gemv1_chunk. tl: this lane's table copy (L > 0). */
#define NV4_TAB_Q(L) ((L) == 0 ? 0 : (L) == 1 ? 1 : (L) == 2 ? 5 : (L) == 3 ? 7 : 15)
template <int L>
NV4_FN void nv4_gemv1t_chunk(uint4 w0, uint4 w1, uint4 x0, uint4 x1, const float sg[4], const nv4_lut &lut,
                             uint32_t tl, float acc[4]) {
    const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
    const float z[4] = {0.f, 0.f, 0.f, 0.f};
    float de[4], dO[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a0[4], a1[4];
        if ((NV4_TAB_Q(L) >> q) & 1) {
            nv4_tab_decode4(q0[q], tl, a0);
            nv4_tab_decode4(q1[q], tl, a1);
        } else {
            nv4_e2m1x8_to_bf16x8(q0[q], lut, a0);
            nv4_e2m1x8_to_bf16x8(q1[q], lut, a1);
        }
        const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]}, f1[4] = {a0[2], a1[2], a0[3], a1[3]};
        float *d = q < 2 ? de : dO;
        const uint4 xv = q & 1 ? x1 : x0;
        nv4_mma_16816(d, f0, xv.x, xv.y, (q & 1) ? d : z);
        nv4_mma_16816(d, f1, xv.z, xv.w, d);
    }
    acc[0] += sg[0] * de[0];
    acc[1] += sg[1] * dO[1];
    acc[2] += sg[2] * de[2];
    acc[3] += sg[3] * dO[3];
}

/* The table decoder of nv4_w4_chunk: the word pairs q in NV4_TAB_Q(L) through the
 * table (tl: this lane's copy), the others by byte permutes; x in K order. */
template <int L>
struct nv4_dec_tab {
    nv4_lut lut;
    uint32_t tl;
    NV4_MFN void scales(uint16_t s, uint32_t &lo, uint32_t &hi) const {
        float a, b;
        nv4_e4m3x2_to_f32x2(s, a, b);
        lo = nv4_pack_bf16x2(a, a);
        hi = nv4_pack_bf16x2(b, b);
    }
    NV4_MFN void decode(int q, uint32_t w, uint32_t out[4]) const {
        if ((NV4_TAB_Q(L) >> q) & 1) nv4_tab_decode4(w, tl, out);
        else nv4_e2m1x8_to_bf16x8(w, lut, out);
    }
};

/* The M <= 8 form with the table (scaled A, tokens in the B columns): nv4_w4_chunk
 * with nv4_dec_tab<L>, xv[v] = token g's x, elements 8v .. 8v + 7 of the lane's
 * 32-element slice (K order). Not used by a kernel now (fp4_gemm at M = 2..8 measured
 * slower with it on the H200, bench/RESULTS.md); kept, checked by the host emulation,
 * for kernels that put tokens in the columns (the fused MoE decode's expert GEMVs). */
template <int L>
NV4_FN void nv4_w4_chunk_tab(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 (&xv)[4],
                             const nv4_lut &lut, uint32_t tl, float acc[4]) {
    nv4_w4_chunk(nv4_dec_tab<L>{lut, tl}, w0, w1, s0, s1, xv, acc);
}

#endif
