"""The C++ source of :mod:`superkernel.runtime.cpu.quant_kernels` (its torch operators and their AVX-512, AVX2
and plain loops), a ``%``-format template: ``quant_kernels.source()`` fills in the block sizes and flags."""

SOURCE = r"""
// superkernel int8 GEMV kernels (superkernel.runtime.cpu.quant_kernels). Do not edit.
// Built with: %(flags)s
#include <Python.h>
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <vector>

#pragma GCC optimize("O2")

#define SK_CAT2(a, b) a##b
#define SK_CAT(a, b) SK_CAT2(a, b)
#define SK_STR2(a) #a
#define SK_STR(a) SK_STR2(a)

namespace {

constexpr int64_t kRows = %(rows)d;            // weight-only: rows per block
constexpr int kW8A8Rows = %(w8a8_rows)d;         // W8A8: rows per block
constexpr int kW8A8Ahead = %(w8a8_ahead)d;       // W8A8: prefetch distance in rows
constexpr int kW8A8Avx2Rows = %(w8a8_avx2_rows)d;  // W8A8 with AVX2: rows per block
constexpr int kW8A8Avx2Ahead = %(w8a8_avx2_ahead)d;  // and its prefetch distance in rows

// The widest instruction set the kernels may use (set_isa, for tests and measurements): 2 AVX-512, 1 AVX2, 0 the
// plain loops everywhere. Each kernel takes the widest one this CPU has within it.
int g_isa = 2;
bool has_avx512() { return g_isa >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }
bool has_vnni() { return has_avx512() && __builtin_cpu_supports("avx512vnni"); }
bool has_avx2() { return g_isa >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

__attribute__((target("avx2"))) inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2"))) inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ---- W8A8: y[m, n] = sum_k x[m, k] * w[n, k], exact in int32 ----
void w8a8_plain(const int8_t* x, const int8_t* w, int32_t* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      int32_t s = 0;
      for (int64_t k = 0; k < K; ++k) s += int32_t(x[m * K + k]) * int32_t(w[n * K + k]);
      y[m * N + n] = s;
    }
}

// R rows of w at once; (w + 128) as vpdpbusd's unsigned operand, x signed: sum((w + 128) * x) - 128 * sum(x).
template <int R, int AHEAD>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void w8a8_block(const int8_t* x, const int8_t* w, int32_t* y, int64_t M, int64_t N, int64_t K, int64_t n,
                const int32_t* xsum) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int64_t kmain = K & ~int64_t(63);
  const __mmask64 tail = K > kmain ? (~0ULL >> (64 - (K - kmain))) : 0;
  const int8_t* w0 = w + n * K;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xr = x + m * K;
    __m512i a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_si512();
    const char* pf = (const char*)(w0 + AHEAD * K);  // the rows AHEAD rows on, R lines per step
    for (int64_t k = 0; k < kmain; k += 64) {
      if (m == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm_prefetch(pf + 64 * r, _MM_HINT_T1);
        pf += 64 * R;
      }
      const __m512i xv = _mm512_loadu_si512(xr + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        a[r] = _mm512_dpbusd_epi32(a[r], _mm512_xor_si512(_mm512_loadu_si512(w0 + r * K + k), flip), xv);
    }
    if (tail) {  // masked: x is 0 there, so the flipped weight adds nothing
      const __m512i xv = _mm512_maskz_loadu_epi8(tail, xr + kmain);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        a[r] = _mm512_dpbusd_epi32(a[r], _mm512_xor_si512(_mm512_maskz_loadu_epi8(tail, w0 + r * K + kmain), flip), xv);
    }
    const int32_t c = 128 * xsum[m];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) y[m * N + n + r] = _mm512_reduce_add_epi32(a[r]) - c;
  }
}

// AVX2 has no byte dot that is exact for every int8 pair (vpmaddubsw saturates its 16-bit sums), so the weight is
// widened to int16 and multiplied by x, widened once per call (x16), with vpmaddwd: pairs of products summed in
// int32, exact ((-128) * (-128) * 2 fits). R rows at once share each load of x; the prefetch runs AHEAD rows on.
template <int R, int AHEAD>
__attribute__((target("avx2,fma")))
void w8a8_block_avx2(const int8_t* x, const int16_t* x16, const int8_t* w, int32_t* y, int64_t M, int64_t N,
                     int64_t K, int64_t n) {
  const int64_t kmain = K & ~int64_t(15);
  const int8_t* w0 = w + n * K;
  for (int64_t m = 0; m < M; ++m) {
    const int16_t* xr = x16 + m * K;
    __m256i a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_si256();
    const char* pf = (const char*)(w0 + AHEAD * K);
    for (int64_t k = 0; k < kmain; k += 16) {
      if (m == 0 && (k & 63) == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm_prefetch(pf + 64 * r, _MM_HINT_T1);
        pf += 64 * R;
      }
      const __m256i xv = _mm256_loadu_si256((const __m256i*)(xr + k));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(
                   _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(w0 + r * K + k))), xv));
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      int32_t s = hsum_epi32(a[r]);
      for (int64_t k = kmain; k < K; ++k) s += int32_t(x[m * K + k]) * int32_t(w0[r * K + k]);
      y[m * N + n + r] = s;
    }
  }
}

// ---- weight-only: y[m, n] = sum_k x[m, k] * float(w[n, k]), float32 ----
void woq_plain(const float* x, const int8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float s = 0.f;
      for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * float(w[n * K + k]);
      y[m * N + n] = s;
    }
}

template <int R>
__attribute__((target("avx512f,avx512bw")))
void woq_block(const float* x, const int8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n) {
  const int64_t kmain = K & ~int64_t(15);
  const int8_t* w0 = w + n * K;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    __m512 a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
    const char* pf = (const char*)(w0 + 2 * R * K);
    for (int64_t k = 0; k < kmain; k += 16) {
      if (m == 0 && (k & 63) == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm_prefetch(pf + 64 * r, _MM_HINT_T1);
        pf += 64 * R;
      }
      const __m512 xv = _mm512_loadu_ps(xr + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        a[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                   _mm_loadu_si128((const __m128i*)(w0 + r * K + k)))), xv, a[r]);
    }
    float s[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) s[r] = _mm512_reduce_add_ps(a[r]);
    for (int64_t k = kmain; k < K; ++k)
      for (int r = 0; r < R; ++r) s[r] += xr[k] * float(w0[r * K + k]);
    for (int r = 0; r < R; ++r) y[m * N + n + r] = s[r];
  }
}

// AVX2: 8 weights at a time widened to float32 (vpmovsxbd, vcvtdq2ps) and FMA, R rows at once, prefetched as above.
template <int R>
__attribute__((target("avx2,fma")))
void woq_block_avx2(const float* x, const int8_t* w, float* y, int64_t M, int64_t N, int64_t K, int64_t n) {
  const int64_t kmain = K & ~int64_t(7);
  const int8_t* w0 = w + n * K;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    __m256 a[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[r] = _mm256_setzero_ps();
    const char* pf = (const char*)(w0 + 2 * R * K);
    for (int64_t k = 0; k < kmain; k += 8) {
      if (m == 0 && (k & 63) == 0) {
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm_prefetch(pf + 64 * r, _MM_HINT_T1);
        pf += 64 * R;
      }
      const __m256 xv = _mm256_loadu_ps(xr + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        a[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                   _mm_loadl_epi64((const __m128i*)(w0 + r * K + k)))), xv, a[r]);
    }
    float s[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) s[r] = hsum_ps(a[r]);
    for (int64_t k = kmain; k < K; ++k)
      for (int r = 0; r < R; ++r) s[r] += xr[k] * float(w0[r * K + k]);
    for (int r = 0; r < R; ++r) y[m * N + n + r] = s[r];
  }
}

// ---- int4 weight-only, torchao's CPU packed layout (ATen's _convert_weight_to_int4pack_for_cpu) ----
// ATen packs for the vector width it runs with (its CPU capability: AVX512, AVX2 or DEFAULT, ATEN_CPU_CAPABILITY
// can lower it), and its own kernel reads the weight back the same way, so the layout is this process's:
// w: uint8 [N / B, K, B / 2]: byte j of (block b, k) holds two rows of block b, low nibble then high one:
//   AVX512: B = 64, rows j and 32 + j; AVX2: B = 32, rows j and 16 + j; DEFAULT: B = 32, rows 2j and 2j + 1.
// Python finds which by packing a probe with ATen (quant_kernels.int4_layout) and says so through
// set_int4_layout; until then, or for a layout none of these, the op refuses.
// sz: float32 [K / G, N, 2], (scale, zero) per group of G along K; weight = (q - 8) * scale + zero.
enum Int4Layout { kInt4Unknown = 0, kInt4Avx512 = 1, kInt4Avx2 = 2, kInt4Pairs = 3 };
int g_int4_layout = kInt4Unknown;
int64_t int4_block_rows() { return g_int4_layout == kInt4Avx512 ? 64 : 32; }
// The vector kernel for this process's layout on this CPU: 2 AVX-512 (AVX512's layout), 1 AVX2 (AVX2's), 0 none.
int int4_isa() {
  return g_int4_layout == kInt4Avx512 && has_avx512() ? 2 : g_int4_layout == kInt4Avx2 && has_avx2() ? 1 : 0;
}

void int4_plain(const float* x, const uint8_t* w, const float* sz, float* y, int64_t M, int64_t N, int64_t K,
                int64_t G, int64_t b0, int64_t b1) {
  const int64_t B = int4_block_rows(), H = B / 2;
  const bool pairs = g_int4_layout == kInt4Pairs;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < B; ++j) {
        const int64_t n = B * b + j, col = pairs ? j / 2 : j %% H;
        const bool high = pairs ? (j & 1) : j >= H;
        float s = 0.f;
        for (int64_t k = 0; k < K; ++k) {
          const uint8_t byte = w[(b * K + k) * H + col];
          const int q = high ? (byte >> 4) : (byte & 15);
          const float* p = sz + ((k / G) * N + n) * 2;
          s += x[m * K + k] * (float(q - 8) * p[0] + p[1]);
        }
        y[m * N + n] = s;
      }
}

// One block of 64 output columns (the AVX512 layout): per group, a = sum_k x[k] * (q - 8) and xs = sum_k x[k] in
// float32, then y += scale * a + zero * xs. A byte widened to a 32-bit lane indexes a 16-float table (q - 8) with
// its low nibble (vpermps reads the low four bits), and with its high nibble after a shift: 13 instructions per 64
// weights, against 19 with and/shift/convert (0.17 ms against 0.23 ms for a 4864x896 GEMV here; a second set
// of accumulators for odd k measured no faster: the loop is throughput-bound, not waiting on FMA latency).
__attribute__((target("avx512f,avx512bw")))
void int4_block(const float* x, const uint8_t* w, const float* sz, float* y, int64_t M, int64_t N, int64_t K,
                int64_t G, int64_t b) {
  const __m512 table = _mm512_set_ps(7, 6, 5, 4, 3, 2, 1, 0, -1, -2, -3, -4, -5, -6, -7, -8);
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  const uint8_t* wb = w + b * K * 32;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    __m512 out[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t g0 = 0; g0 < K; g0 += G) {
      __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      float xs = 0.f;
      for (int64_t k = g0; k < g0 + G; ++k) {
        if (m == 0) _mm_prefetch((const char*)(wb + (k + 16) * 32), _MM_HINT_T0);
        const __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + k * 32)));
        const __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(wb + k * 32 + 16)));
        const __m512 xv = _mm512_set1_ps(xr[k]);
        xs += xr[k];
        a[0] = _mm512_fmadd_ps(_mm512_permutexvar_ps(b0, table), xv, a[0]);
        a[1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(b1, table), xv, a[1]);
        a[2] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), table), xv, a[2]);
        a[3] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), table), xv, a[3]);
      }
      const float* p = sz + ((g0 / G) * N + 64 * b) * 2;  // 64 (scale, zero) pairs
      const __m512 xsv = _mm512_set1_ps(xs);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512 u = _mm512_loadu_ps(p + 32 * c), v = _mm512_loadu_ps(p + 32 * c + 16);
        const __m512 scale = _mm512_permutex2var_ps(u, even, v), zero = _mm512_permutex2var_ps(u, odd, v);
        out[c] = _mm512_fmadd_ps(zero, xsv, _mm512_fmadd_ps(scale, a[c], out[c]));
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(y + m * N + 64 * b + 16 * c, out[c]);
  }
}

// One k of the block: its 16 bytes (32 rows' nibbles) times x[k] into the four sums s[0..3] (rows 0-7, 8-15, 16-23,
// 24-31).
__attribute__((target("avx2,fma"), always_inline))
inline void int4_k_avx2(const uint8_t* wk, float xk, __m256* s) {
  const __m256i nibble = _mm256_set1_epi32(15);
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)wk));
  const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(wk + 8)));
  const __m256 xv = _mm256_set1_ps(xk);
  s[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b0, nibble)), xv, s[0]);
  s[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b1, nibble)), xv, s[1]);
  s[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), xv, s[2]);
  s[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)), xv, s[3]);
}

// One block of 32 output columns (the AVX2 layout: byte j holds rows j and 16 + j): a byte widened to a 32-bit lane
// gives its row's q with `& 15` and the row 16 on with `>> 4`, converted to float32 and multiplied by x[k] (FMA).
// Two k at a time into two sets of sums: one set is bound by the FMA's latency (4 cycles a k), not by its
// throughput. Per group the sums a of x * q become scale * (a - 8 * sum(x)) + zero * sum(x).
__attribute__((target("avx2,fma")))
void int4_block_avx2(const float* x, const uint8_t* w, const float* sz, float* y, int64_t M, int64_t N, int64_t K,
                     int64_t G, int64_t b) {
  const uint8_t* wb = w + b * K * 16;
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    __m256 out[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) out[c] = _mm256_setzero_ps();
    for (int64_t g0 = 0; g0 < K; g0 += G) {
      __m256 a[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) a[c] = _mm256_setzero_ps();
      float xs = 0.f;
      int64_t k = g0;
      for (; k + 2 <= g0 + G; k += 2) {
        if (m == 0 && (k & 3) == 0) _mm_prefetch((const char*)(wb + (k + 32) * 16), _MM_HINT_T0);
        int4_k_avx2(wb + k * 16, xr[k], a);
        int4_k_avx2(wb + (k + 1) * 16, xr[k + 1], a + 4);
        xs += xr[k] + xr[k + 1];
      }
      for (; k < g0 + G; ++k) {  // an odd group size
        int4_k_avx2(wb + k * 16, xr[k], a);
        xs += xr[k];
      }
      // the 32 rows' (scale, zero) pairs, 8 rows at a time split into 8 scales and 8 zeros (lane order restored
      // by the permute); the same fused operations per row as a scalar loop, so the same bits
      const float* p = sz + ((g0 / G) * N + 32 * b) * 2;
      const __m256 xsv = _mm256_set1_ps(xs);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256 lo = _mm256_loadu_ps(p + 16 * c), hi = _mm256_loadu_ps(p + 16 * c + 8);
        const __m256 sc = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
        const __m256 ze = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
        const __m256 dot = _mm256_fmadd_ps(_mm256_set1_ps(-8.f), xsv, _mm256_add_ps(a[c], a[c + 4]));
        out[c] = _mm256_fmadd_ps(ze, xsv, _mm256_fmadd_ps(sc, dot, out[c]));
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(y + m * N + 32 * b + 8 * c, out[c]);
  }
}

void check(const at::Tensor& x, const at::Tensor& w, c10::ScalarType xtype, const char* op) {
  TORCH_CHECK(x.scalar_type() == xtype && w.scalar_type() == at::kChar && x.dim() == 2 && w.dim() == 2 &&
              x.size(1) == w.size(1) && x.device().is_cpu() && w.device().is_cpu(),
              "superkernel::", op, ": a [M, K] ", c10::toString(xtype), " and an int8 [N, K] CPU tensor expected, got ",
              x.scalar_type(), x.sizes(), " and ", w.scalar_type(), w.sizes());
}

// Rows [n0, n1) of the output: blocks of RB rows, then single rows (still vectorized).
template <int64_t RB, typename Block, typename Row, typename Plain>
void rows(int64_t n0, int64_t n1, bool fast, Block block, Row row, Plain plain) {
  if (!fast) { plain(n0, n1); return; }
  int64_t n = n0;
  for (; n + RB <= n1; n += RB) block(n);
  for (; n < n1; ++n) row(n);
}

at::Tensor int8_gemv(const at::Tensor& x_, const at::Tensor& w_) {
  check(x_, w_, at::kChar, "int8_gemv");
  const at::Tensor x = x_.contiguous(), w = w_.contiguous();
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kInt));
  const int8_t* xp = x.const_data_ptr<int8_t>();
  const int8_t* wp = w.const_data_ptr<int8_t>();
  int32_t* yp = y.mutable_data_ptr<int32_t>();
  std::vector<int32_t> xsum(M, 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xsum[m] += xp[m * K + k];
  if (has_vnni()) {
    const int64_t blocks = (N + kW8A8Rows - 1) / kW8A8Rows;
    at::parallel_for(0, blocks, 64 / kW8A8Rows, [&](int64_t b0, int64_t b1) {
      rows<kW8A8Rows>(b0 * kW8A8Rows, std::min(N, b1 * kW8A8Rows), true,
           [&](int64_t n) { w8a8_block<kW8A8Rows, kW8A8Ahead>(xp, wp, yp, M, N, K, n, xsum.data()); },
           [&](int64_t n) { w8a8_block<1, kW8A8Ahead>(xp, wp, yp, M, N, K, n, xsum.data()); },
           [&](int64_t a, int64_t b) { w8a8_plain(xp, wp, yp, M, N, K, a, b); });
    });
    return y;
  }
  const bool avx2 = has_avx2();
  std::vector<int16_t> x16(avx2 ? M * K : 0);
  for (size_t i = 0; i < x16.size(); ++i) x16[i] = xp[i];
  const int64_t blocks = (N + kW8A8Avx2Rows - 1) / kW8A8Avx2Rows;
  at::parallel_for(0, blocks, 64 / kW8A8Avx2Rows, [&](int64_t b0, int64_t b1) {
    rows<kW8A8Avx2Rows>(b0 * kW8A8Avx2Rows, std::min(N, b1 * kW8A8Avx2Rows), avx2,
         [&](int64_t n) { w8a8_block_avx2<kW8A8Avx2Rows, kW8A8Avx2Ahead>(xp, x16.data(), wp, yp, M, N, K, n); },
         [&](int64_t n) { w8a8_block_avx2<1, kW8A8Avx2Ahead>(xp, x16.data(), wp, yp, M, N, K, n); },
         [&](int64_t a, int64_t b) { w8a8_plain(xp, wp, yp, M, N, K, a, b); });
  });
  return y;
}

at::Tensor int8_weight_gemv(const at::Tensor& x_, const at::Tensor& w_) {
  check(x_, w_, at::kFloat, "int8_weight_gemv");
  const at::Tensor x = x_.contiguous(), w = w_.contiguous();
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const int8_t* wp = w.const_data_ptr<int8_t>();
  float* yp = y.mutable_data_ptr<float>();
  const bool avx512 = has_avx512(), avx2 = has_avx2();
  const int64_t blocks = (N + kRows - 1) / kRows;
  at::parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
    if (avx512)
      rows<kRows>(b0 * kRows, std::min(N, b1 * kRows), true,
           [&](int64_t n) { woq_block<kRows>(xp, wp, yp, M, N, K, n); },
           [&](int64_t n) { woq_block<1>(xp, wp, yp, M, N, K, n); },
           [&](int64_t a, int64_t b) { woq_plain(xp, wp, yp, M, N, K, a, b); });
    else
      rows<kRows>(b0 * kRows, std::min(N, b1 * kRows), avx2,
           [&](int64_t n) { woq_block_avx2<kRows>(xp, wp, yp, M, N, K, n); },
           [&](int64_t n) { woq_block_avx2<1>(xp, wp, yp, M, N, K, n); },
           [&](int64_t a, int64_t b) { woq_plain(xp, wp, yp, M, N, K, a, b); });
  });
  return y;
}

at::Tensor int4_weight_gemv(const at::Tensor& x_, const at::Tensor& w_, int64_t G, const at::Tensor& sz_) {
  TORCH_CHECK(x_.scalar_type() == at::kFloat && x_.dim() == 2 && w_.scalar_type() == at::kByte && w_.dim() == 2 &&
              sz_.scalar_type() == at::kFloat && sz_.dim() == 3 && x_.device().is_cpu() && w_.device().is_cpu() &&
              sz_.device().is_cpu(), "superkernel::int4_weight_gemv: a [M, K] float32, a uint8 [N, K / 2] packed ",
              "int4 weight and float32 [K / G, N, 2] scales and zeros on the CPU expected, got ", x_.scalar_type(),
              x_.sizes(), ", ", w_.scalar_type(), w_.sizes(), " and ", sz_.scalar_type(), sz_.sizes());
  const int64_t M = x_.size(0), K = x_.size(1), N = w_.size(0);
  TORCH_CHECK(G > 0 && K %% G == 0 && N %% 64 == 0 && w_.size(1) * 2 == K && sz_.size(0) == K / G &&
              sz_.size(1) == N && sz_.size(2) == 2, "superkernel::int4_weight_gemv: N a multiple of 64 and K of the ",
              "group size ", G, " expected, got N ", N, ", K ", K, ", weight ", w_.sizes(), ", scales ", sz_.sizes());
  const at::Tensor x = x_.contiguous(), w = w_.contiguous(), sz = sz_.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const uint8_t* wp = w.const_data_ptr<uint8_t>();
  const float* sp = sz.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  TORCH_CHECK(g_int4_layout != kInt4Unknown, "superkernel::int4_weight_gemv: this process's packed int4 layout ",
              "(ATen's _convert_weight_to_int4pack_for_cpu) is not one this kernel reads");
  const int isa = int4_isa();
  at::parallel_for(0, N / int4_block_rows(), 1, [&](int64_t b0, int64_t b1) {
    if (isa == 0) { int4_plain(xp, wp, sp, yp, M, N, K, G, b0, b1); return; }
    for (int64_t b = b0; b < b1; ++b)
      if (isa == 2) int4_block(xp, wp, sp, yp, M, N, K, G, b);
      else int4_block_avx2(xp, wp, sp, yp, M, N, K, G, b);
  });
  return y;
}

%(w4a8)s

const char* isa_name(int isa) { return isa == 2 ? "avx512" : isa == 1 ? "avx2" : ""; }

// Each op's vector kernel on this CPU: "avx512", "avx2", or "" (the plain loop: falsy).
PyObject* sk_fast_path(PyObject*, PyObject*) {
  return Py_BuildValue("{s:s,s:s,s:s,s:s}", "int8_gemv", isa_name(has_vnni() ? 2 : has_avx2() ? 1 : 0),
                       "int8_weight_gemv", isa_name(has_avx512() ? 2 : has_avx2() ? 1 : 0),
                       "int4_weight_gemv", isa_name(int4_isa()), "int4_int8_gemv", isa_name(w4a8_isa()));
}

PyObject* sk_set_int4_layout(PyObject*, PyObject* code) {
  const long v = PyLong_AsLong(code);
  if (v == -1 && PyErr_Occurred()) return nullptr;
  g_int4_layout = v >= kInt4Unknown && v <= kInt4Pairs ? int(v) : kInt4Unknown;
  Py_RETURN_NONE;
}

PyObject* sk_set_isa(PyObject*, PyObject* level) {
  const long v = PyLong_AsLong(level);
  if (v == -1 && PyErr_Occurred()) return nullptr;
  g_isa = v < 0 ? 0 : v > 2 ? 2 : int(v);
  Py_RETURN_NONE;
}

PyMethodDef sk_methods[] = {{"fast_path", sk_fast_path, METH_NOARGS, nullptr},
                            {"set_isa", sk_set_isa, METH_O, nullptr},
                            {"set_int4_layout", sk_set_int4_layout, METH_O, nullptr}, {nullptr, nullptr, 0, nullptr}};
PyModuleDef sk_module = {PyModuleDef_HEAD_INIT, SK_STR(SK_MODULE), nullptr, -1, sk_methods};

}  // namespace

TORCH_LIBRARY_FRAGMENT(superkernel, m) {
  m.def("int8_gemv(Tensor x, Tensor w) -> Tensor");
  m.def("int8_weight_gemv(Tensor x, Tensor w) -> Tensor");
  m.def("int4_weight_gemv(Tensor x, Tensor w, int group_size, Tensor scales_and_zeros) -> Tensor");
  m.def("%(w4a8_schema)s");
}

TORCH_LIBRARY_IMPL(superkernel, CPU, m) {
  m.impl("int8_gemv", &int8_gemv);
  m.impl("int8_weight_gemv", &int8_weight_gemv);
  m.impl("int4_weight_gemv", &int4_weight_gemv);
  m.impl("int4_int8_gemv", &int4_int8_gemv);
}

extern "C" __attribute__((visibility("default"))) PyObject* SK_CAT(PyInit_, SK_MODULE)(void) {
  return PyModule_Create(&sk_module);
}
"""

__all__ = ["SOURCE"]
