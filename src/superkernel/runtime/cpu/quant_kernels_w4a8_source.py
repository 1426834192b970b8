"""The C++ of ``torch.ops.superkernel.int4_int8_gemv`` (the ``w4a8`` scheme): int4 weights (held one per int8, as
torchao's ``IntxUnpackedToInt8Tensor`` holds them) in groups, times int8 activations with a scale and zero point per
token, by integer dot products per group, as llama.cpp's Q4_0 x Q8_0. Spliced into
:mod:`superkernel.runtime.cpu.quant_kernels`' module (inside its namespace: it uses ``has_avx2``, ``hsum_ps``).

Per token m, row n and group g: ``D = sum(xq * wq)``, ``SW = sum(wq)``, ``SX = sum(xq)`` (exact int32), and
``y[m, n] = xs[m] * sum_g ws[n, g] * (D - xz[m] * SW - wz[n, g] * SX + G * xz[m] * wz[n, g])``, accumulated in
float32. AVX2: 32 bytes a step; ``vpmaddubsw`` of ``|x|`` and ``w * sign(x)`` (|w| <= 8: pair sums stay far below
int16's bound, so the byte dot is exact), ``vpmaddwd`` by ones to int32 lanes, converted and scaled per group with FMA.
"""

SOURCE = r"""
// ---- W4A8: int4 weights (one per int8, groups of G, a scale and zero each) x int8 activations (the same per token)
void w4a8_plain(const int8_t* x, const int8_t* w, int64_t G, const float* xs, const int32_t* xz, const float* ws,
                const int8_t* wz, float* y, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  const int64_t groups = K / G;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t d = 0, sw = 0, sx = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          d += int32_t(x[m * K + k]) * int32_t(w[n * K + k]);
          sw += w[n * K + k];
          sx += x[m * K + k];
        }
        const int32_t z = wz[n * groups + g];
        acc += ws[n * groups + g] * float(d - xz[m] * sw - z * sx + int32_t(G) * xz[m] * z);
      }
      y[m * N + n] = xs[m] * acc;
    }
}

// One row n for every token: 32 weights a step; |x| times w * sign(x) by vpmaddubsw (exact: |w| <= 8), pairs to
// int32 lanes by vpmaddwd; per group the lanes (D - xz * SW) are converted and scaled by ws[n, g] with FMA, and the
// weight-zero terms added as scalars (zero for torchao's symmetric int4).
__attribute__((target("avx2,fma")))
void w4a8_row_avx2(const int8_t* x, const int8_t* w, int64_t G, const float* xs, const int32_t* xz, const float* ws,
                   const int8_t* wz, const int32_t* xsum, float* y, int64_t M, int64_t N, int64_t K, int64_t n) {
  const int64_t groups = K / G;
  const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
  const int8_t* wr = w + n * K;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xr = x + m * K;
    const __m256i zx = _mm256_set1_epi32(xz[m]);
    __m256 acc = _mm256_setzero_ps();
    float corr = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      __m256i d = _mm256_setzero_si256(), sw = _mm256_setzero_si256();
      for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
        const __m256i xv = _mm256_loadu_si256((const __m256i*)(xr + k));
        const __m256i wv = _mm256_loadu_si256((const __m256i*)(wr + k));
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(wv, xv));
        d = _mm256_add_epi32(d, _mm256_madd_epi16(p, ones16));
        sw = _mm256_add_epi32(sw, _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, wv), ones16));
      }
      const float s = ws[n * groups + g];
      const __m256i v = _mm256_sub_epi32(d, _mm256_mullo_epi32(zx, sw));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(s), acc);
      const int32_t z = wz[n * groups + g];
      if (z) corr += s * float(int32_t(G) * xz[m] * z - z * xsum[m * groups + g]);
    }
    y[m * N + n] = xs[m] * (hsum_ps(acc) + corr);
  }
}

int w4a8_isa() { return has_avx2() ? 1 : 0; }

at::Tensor int4_int8_gemv(const at::Tensor& x_, const at::Tensor& w_, int64_t G, const at::Tensor& xs_,
                          const at::Tensor& xz_, const at::Tensor& ws_, const at::Tensor& wz_) {
  TORCH_CHECK(x_.scalar_type() == at::kChar && w_.scalar_type() == at::kChar && x_.dim() == 2 && w_.dim() == 2 &&
              x_.size(1) == w_.size(1) && G > 0 && G % 32 == 0 && x_.size(1) % G == 0 &&
              xs_.scalar_type() == at::kFloat && xs_.numel() == x_.size(0) && xz_.numel() == x_.size(0) &&
              ws_.scalar_type() == at::kFloat && ws_.numel() == w_.size(0) * (x_.size(1) / G) &&
              wz_.scalar_type() == at::kChar && wz_.numel() == ws_.numel() && x_.device().is_cpu() &&
              w_.device().is_cpu(), "superkernel::int4_int8_gemv: int8 [M, K] activations, int8 [N, K] int4 values, "
              "a group size G (a multiple of 32 dividing K), float32 [M] scales and [M] zeros of x, float32 "
              "[N, K / G] scales and int8 [N, K / G] zeros of w expected, got ", x_.sizes(), ", ", w_.sizes(),
              ", G ", G, ", ", xs_.sizes(), ", ", xz_.sizes(), ", ", ws_.sizes(), ", ", wz_.sizes());
  const at::Tensor x = x_.contiguous(), w = w_.contiguous(), xs = xs_.contiguous(), ws = ws_.contiguous(),
                   wz = wz_.contiguous(), xz = xz_.to(at::kInt).contiguous();
  const int64_t M = x.size(0), N = w.size(0), K = x.size(1), groups = K / G;
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  const int8_t* xp = x.const_data_ptr<int8_t>();
  const int8_t* wp = w.const_data_ptr<int8_t>();
  std::vector<int32_t> xsum(M * groups, 0);  // SX per token and group (the weight-zero term)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xsum[m * groups + k / G] += xp[m * K + k];
  const bool avx2 = w4a8_isa() == 1;
  float* yp = y.mutable_data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    if (!avx2) {
      w4a8_plain(xp, wp, G, xs.const_data_ptr<float>(), xz.const_data_ptr<int32_t>(), ws.const_data_ptr<float>(),
                 wz.const_data_ptr<int8_t>(), yp, M, N, K, n0, n1);
      return;
    }
    for (int64_t n = n0; n < n1; ++n)
      w4a8_row_avx2(xp, wp, G, xs.const_data_ptr<float>(), xz.const_data_ptr<int32_t>(), ws.const_data_ptr<float>(),
                    wz.const_data_ptr<int8_t>(), xsum.data(), yp, M, N, K, n);
  });
  return y;
}
"""

#: its operator's schema (the module's TORCH_LIBRARY_FRAGMENT)
SCHEMA = ("int4_int8_gemv(Tensor x, Tensor w, int group_size, Tensor x_scale, Tensor x_zero, Tensor w_scale, "
          "Tensor w_zero) -> Tensor")

__all__ = ["SCHEMA", "SOURCE"]
