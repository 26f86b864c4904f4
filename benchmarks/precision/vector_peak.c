// The vector FLOP rate one core really reaches: 12 independent accumulators of fp32 FMA (zmm, ymm) and of the
// AVX-512 BF16 dot product VDPBF16PS (zmm, ymm; each lane adds two bf16 products: 4 FLOPs per fp32 lane), kept in
// registers, no memory traffic. Used by benchmarks/precision/ov_bf16_split.py for the peaks its shares are of:
// a peak worked out from flags and the nominal clock assumes two 512-bit FMA units, which Zen 4 does not have
// (its AVX-512 runs on 256-bit units), and misses the clock the cores really run at.
//   gcc -O2 -mavx512f -mavx512bf16 -mavx512vl -mfma -o vector_peak vector_peak.c && ./vector_peak
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#define N 100000000L
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}

// 12 accumulators of type ACC (set to 0..11 by SET), each updated N times by OP(acc, b, c) in registers; one
// instruction does FLOPS. Every accumulator's first lane goes into *out, so no loop is optimized away.
#define TIME(NAME, ACC, SET, OPND, B, C, OP, FLOPS, out) {                                               \
    OPND b = B, c = C;                                                                                   \
    ACC a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), a5 = SET(5.f),        \
        a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), a10 = SET(10.f), a11 = SET(11.f);    \
    double t = now();                                                                                    \
    for (long n = 0; n < N; n++) {                                                                       \
      a0 = OP(a0, b, c); a1 = OP(a1, b, c); a2 = OP(a2, b, c); a3 = OP(a3, b, c); a4 = OP(a4, b, c);     \
      a5 = OP(a5, b, c); a6 = OP(a6, b, c); a7 = OP(a7, b, c); a8 = OP(a8, b, c); a9 = OP(a9, b, c);     \
      a10 = OP(a10, b, c); a11 = OP(a11, b, c);                                                          \
      __asm__ volatile("" ::: "memory");                                                                 \
    }                                                                                                    \
    t = now() - t;                                                                                       \
    ACC all[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};                                    \
    for (int i = 0; i < 12; i++) { float lane; memcpy(&lane, &all[i], sizeof lane); *(out) += lane; }   \
    printf("%s: %.1f GFLOP/s per core (%.3f ns per instruction)\n", NAME, N * 12 * (FLOPS) / t / 1e9,   \
           t / (N * 12) * 1e9); }

int main(void) {
  float out = 0;
  TIME("fp32 FMA zmm", __m512, _mm512_set1_ps, __m512, _mm512_set1_ps(1.0000001f), _mm512_set1_ps(1e-9f),
       _mm512_fmadd_ps, 32.0, &out)
  TIME("fp32 FMA ymm", __m256, _mm256_set1_ps, __m256, _mm256_set1_ps(1.0000001f), _mm256_set1_ps(1e-9f),
       _mm256_fmadd_ps, 16.0, &out)
  // bf16 pairs: 1.0 and a tiny value, so the sums stay finite
  TIME("bf16 VDPBF16PS zmm", __m512, _mm512_set1_ps, __m512bh, (__m512bh)_mm512_set1_epi16(0x3f80),
       (__m512bh)_mm512_set1_epi16(0x3001), _mm512_dpbf16_ps, 64.0, &out)
  TIME("bf16 VDPBF16PS ymm", __m256, _mm256_set1_ps, __m256bh, (__m256bh)_mm256_set1_epi16(0x3f80),
       (__m256bh)_mm256_set1_epi16(0x3001), _mm256_dpbf16_ps, 32.0, &out)
  printf("(checksum %g)\n", out);
  return 0;
}
