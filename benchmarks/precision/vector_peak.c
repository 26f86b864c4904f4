// The vector FLOP rate one core really reaches: 12 independent accumulators of fp32 FMA (zmm, ymm) and of the
// AVX-512 BF16 dot product VDPBF16PS (zmm, ymm; each lane adds two bf16 products: 4 FLOPs per fp32 lane), kept in
// registers, no memory traffic. Used by benchmarks/precision/ov_bf16_split.py for the peaks its shares are of:
// a peak worked out from flags and the nominal clock assumes two 512-bit FMA units, which Zen 4 does not have
// (its AVX-512 runs on 256-bit units), and misses the clock the cores really run at.
//   gcc -O2 -mavx512f -mavx512bf16 -mavx512vl -mfma -o vector_peak vector_peak.c && ./vector_peak
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#define N 100000000L
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
int main(void){
  double t; float out=0;
  { __m512 b=_mm512_set1_ps(1.0000001f), c=_mm512_set1_ps(1e-9f);
#define I(i) __m512 a##i=_mm512_set1_ps((float)i);
    R12(I)
#undef I
    t=now(); for(long n=0;n<N;n++){
#define F(i) a##i=_mm512_fmadd_ps(a##i,b,c);
      R12(F)
#undef F
      __asm__ volatile("" ::: "memory"); } t=now()-t;
#define S(i) out+=_mm512_reduce_add_ps(a##i);
    R12(S)
#undef S
    printf("fp32 FMA zmm: %.1f GFLOP/s per core (%.3f ns per instruction)\n", N*12*32.0/t/1e9, t/(N*12)*1e9);}
  { __m256 b=_mm256_set1_ps(1.0000001f), c=_mm256_set1_ps(1e-9f);
#define I(i) __m256 a##i=_mm256_set1_ps((float)i);
    R12(I)
#undef I
    t=now(); for(long n=0;n<N;n++){
#define F(i) a##i=_mm256_fmadd_ps(a##i,b,c);
      R12(F)
#undef F
      __asm__ volatile("" ::: "memory"); } t=now()-t;
#define S(i) {float s[8]; _mm256_storeu_ps(s,a##i); out+=s[0];}
    R12(S)
#undef S
    printf("fp32 FMA ymm: %.1f GFLOP/s per core (%.3f ns per instruction)\n", N*12*16.0/t/1e9, t/(N*12)*1e9);}
  { __m512bh b=(__m512bh)_mm512_set1_epi16(0x3f80), c=(__m512bh)_mm512_set1_epi16(0x3001);
#define I(i) __m512 a##i=_mm512_set1_ps((float)i);
    R12(I)
#undef I
    t=now(); for(long n=0;n<N;n++){
#define F(i) a##i=_mm512_dpbf16_ps(a##i,b,c);
      R12(F)
#undef F
      __asm__ volatile("" ::: "memory"); } t=now()-t;
#define S(i) out+=_mm512_reduce_add_ps(a##i);
    R12(S)
#undef S
    printf("bf16 VDPBF16PS zmm: %.1f GFLOP/s per core (%.3f ns per instruction)\n", N*12*64.0/t/1e9, t/(N*12)*1e9);}
  { __m256bh b=(__m256bh)_mm256_set1_epi16(0x3f80), c=(__m256bh)_mm256_set1_epi16(0x3001);
#define I(i) __m256 a##i=_mm256_set1_ps((float)i);
    R12(I)
#undef I
    t=now(); for(long n=0;n<N;n++){
#define F(i) a##i=_mm256_dpbf16_ps(a##i,b,c);
      R12(F)
#undef F
      __asm__ volatile("" ::: "memory"); } t=now()-t;
#define S(i) {float s[8]; _mm256_storeu_ps(s,a##i); out+=s[0];}
    R12(S)
#undef S
    printf("bf16 VDPBF16PS ymm: %.1f GFLOP/s per core (%.3f ns per instruction)\n", N*12*32.0/t/1e9, t/(N*12)*1e9);}
  printf("(checksum %g)\n", out);
  return 0;
}
