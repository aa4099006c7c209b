#include "quant/accuracy.h"

#include <algorithm>
#include <cmath>

namespace kiln::quant {

namespace {

// Row r of a [rows, C] float tensor: the indices of its k largest values.
std::vector<int64_t> top_k(const Tensor& t, int64_t r, int64_t c, int k) {
  std::vector<int64_t> idx(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) idx[size_t(i)] = i;
  k = int(std::min<int64_t>(k, c));
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int64_t a, int64_t b) { return t.as_double(r * c + a) > t.as_double(r * c + b); });
  idx.resize(size_t(k));
  return idx;
}

}  // namespace

void accumulate(Metrics& m, const Tensor& ref, const Tensor& got) {
  if (!dtype_is_float(ref.dtype()) || ref.dims() != got.dims()) return;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    double r = ref.as_double(i), q = got.as_double(i);
    m.sum_d2 += (q - r) * (q - r);
    m.sum_r2 += r * r;
    m.sum_q2 += q * q;
    m.dot += r * q;
    m.acc.max_abs = std::max(m.acc.max_abs, std::fabs(q - r));
  }
  if (ref.rank() >= 1 && ref.numel() > 0) {
    const int64_t c = ref.dim(ref.rank() - 1), n = c ? ref.numel() / c : 0;
    for (int64_t r = 0; r < n; ++r) {
      double d = 0, a = 0, b = 0;
      for (int64_t k = r * c; k < (r + 1) * c; ++k) {
        d += ref.as_double(k) * got.as_double(k);
        a += ref.as_double(k) * ref.as_double(k);
        b += got.as_double(k) * got.as_double(k);
      }
      double cos = a > 0 && b > 0 ? d / std::sqrt(a * b) : (a == b ? 1.0 : 0.0);
      m.unit_rows = m.unit_rows && std::fabs(std::sqrt(a) - 1.0) < 1e-3;
      m.row_cos_sum += cos;
      m.row_cos_min = std::min(m.row_cos_min, cos);
      m.row_count += 1;
    }
  }
  // Logits: [N, C] with enough classes for top-5 to mean something (and not normalized rows).
  m.classifier = ref.rank() == 2 && ref.dim(1) >= 10 && !m.unit_rows;
  if (!m.classifier) return;
  for (int64_t r = 0; r < ref.dim(0); ++r) {
    auto a = top_k(ref, r, ref.dim(1), 5), b = top_k(got, r, ref.dim(1), 5);
    m.top1_hits += a[0] == b[0];
    int common = 0;
    for (int64_t x : a) common += std::count(b.begin(), b.end(), x) > 0;
    m.top5_hits += common / 5.0;
    m.rows += 1;
  }
}

OutputAccuracy finish(Metrics& m) {
  m.acc.rel_l2 = m.sum_r2 > 0 ? std::sqrt(m.sum_d2 / m.sum_r2) : std::sqrt(m.sum_d2);
  m.acc.cosine = m.sum_r2 > 0 && m.sum_q2 > 0 ? m.dot / std::sqrt(m.sum_r2 * m.sum_q2) : 1.0;
  m.acc.unit_rows = m.row_count > 0 && m.unit_rows;
  if (m.row_count > 0) {
    m.acc.row_cosine_mean = m.row_cos_sum / m.row_count;
    m.acc.row_cosine_min = m.row_cos_min;
  }
  if (m.classifier && m.rows > 0) {
    m.acc.top1 = 100.0 * m.top1_hits / m.rows;
    m.acc.top5 = 100.0 * m.top5_hits / m.rows;
  }
  return m.acc;
}

ErrorMetric resolve(ErrorMetric m, const std::vector<OutputAccuracy>& outs) {
  if (m != ErrorMetric::kAuto || outs.empty()) return m == ErrorMetric::kAuto ? ErrorMetric::kRelL2 : m;
  if (outs[0].unit_rows) return ErrorMetric::kCosine;
  return outs[0].top1 >= 0 ? ErrorMetric::kTop1 : ErrorMetric::kRelL2;
}

std::string metric_name(ErrorMetric m) {
  switch (m) {
    case ErrorMetric::kTop1: return "top-1 disagreement %";
    case ErrorMetric::kRelL2: return "relative L2 %";
    case ErrorMetric::kCosine: return "1 - row cosine %";
    case ErrorMetric::kAuto: break;
  }
  return "?";
}

double error_of(ErrorMetric m, const std::vector<OutputAccuracy>& outs) {
  if (outs.empty()) return 0;
  switch (resolve(m, outs)) {
    case ErrorMetric::kTop1: return outs[0].top1 >= 0 ? 100.0 - outs[0].top1 : 100.0;
    case ErrorMetric::kCosine: return 100.0 * (1.0 - outs[0].row_cosine_mean);
    case ErrorMetric::kRelL2:
    case ErrorMetric::kAuto: break;
  }
  return 100.0 * outs[0].rel_l2;
}

}  // namespace kiln::quant
