#include "ir/tensor.h"

#include <atomic>
#include <cmath>
#include <limits>
#include <cstring>

namespace kiln {

namespace {
std::atomic<int64_t> g_max_tensor_bytes{int64_t{16} << 30};
}

int64_t max_tensor_bytes() { return g_max_tensor_bytes.load(); }
void set_max_tensor_bytes(int64_t bytes) { g_max_tensor_bytes.store(bytes); }

std::string dims_to_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

Expected<int64_t> checked_numel(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return KILN_ERROR(kInvalidArgument, "negative dimension {} in shape {}", d, dims_to_string(dims));
  }
  for (int64_t d : dims) {
    if (d == 0) return int64_t{0};
  }
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) {
      return KILN_ERROR(kOutOfMemory, "shape {} has more elements than fit in 64 bits", dims_to_string(dims));
    }
  }
  return n;
}

Expected<Tensor> Tensor::create(DType dtype, std::vector<int64_t> dims) {
  KILN_ASSIGN_OR_RETURN(int64_t n, checked_numel(dims));
  int64_t bytes;
  if (__builtin_mul_overflow(n, int64_t(dtype_size(dtype)), &bytes) || bytes > max_tensor_bytes()) {
    return KILN_ERROR(kOutOfMemory, "tensor {}{} would need {} bytes, over the limit of {} bytes",
                      dtype_name(dtype), dims_to_string(dims), n > 0 && bytes <= 0 ? -1 : bytes,
                      max_tensor_bytes());
  }
  Tensor t;
  t.dtype_ = dtype;
  t.dims_ = std::move(dims);
  t.numel_ = n;
  if (dtype == DType::kString) {
    std::shared_ptr<std::string[]> s(new std::string[size_t(std::max<int64_t>(n, 1))]);
    t.data_ = s.get();
    t.owner_ = std::shared_ptr<void>(s, s.get());
  } else {
    size_t alloc = size_t(std::max<int64_t>(bytes, 1));
    // 64-byte aligned, zeroed.
    void* p = ::operator new[](alloc, std::align_val_t(64), std::nothrow);
    if (!p) return KILN_ERROR(kOutOfMemory, "out of host memory allocating {} bytes", alloc);
    std::memset(p, 0, alloc);
    t.owner_ = std::shared_ptr<void>(p, [](void* q) { ::operator delete[](q, std::align_val_t(64)); });
    t.data_ = p;
  }
  return t;
}

Tensor Tensor::view(DType dtype, std::vector<int64_t> dims, std::shared_ptr<void> owner, void* data) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = checked_numel(dims).value();
  t.dims_ = std::move(dims);
  t.owner_ = std::move(owner);
  t.data_ = data;
  return t;
}

Tensor Tensor::reshaped(std::vector<int64_t> dims) const {
  Tensor t = *this;
  KILN_CHECK(checked_numel(dims).value() == numel_, "reshape {} -> {}", dims_to_string(dims_),
             dims_to_string(dims));
  t.dims_ = std::move(dims);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = create(dtype_, dims_).value();
  if (dtype_ == DType::kString) {
    for (int64_t i = 0; i < numel_; ++i) t.data<std::string>()[i] = data<std::string>()[i];
  } else if (numel_ > 0) {
    std::memcpy(t.data_, data_, nbytes());
  }
  return t;
}

double Tensor::as_double(int64_t i) const {
  return visit_dtype(dtype_, [&]<typename T>() -> double {
    if constexpr (std::is_same_v<T, std::string>) return 0.0;
    else return double(compute_t<T>(static_cast<const T*>(data_)[i]));
  });
}

int64_t Tensor::as_int(int64_t i) const {
  return visit_dtype(dtype_, [&]<typename T>() -> int64_t {
    if constexpr (std::is_same_v<T, std::string>) return 0;
    else if constexpr (is_float_v<T>) {
      // Saturated (NaN as 0): a float outside int64's range would be undefined behaviour, and an
      // index or size that large is refused by whatever reads it.
      const double x = double(float(static_cast<const T*>(data_)[i]));
      if (std::isnan(x)) return 0;
      if (x >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
      if (x <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
      return int64_t(x);
    }
    else return int64_t(static_cast<const T*>(data_)[i]);
  });
}

std::vector<int64_t> Tensor::to_int_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) v[size_t(i)] = as_int(i);
  return v;
}

std::string Tensor::summary() const { return std::string(dtype_name(dtype_)) + dims_to_string(dims_); }

std::string Data::summary() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kTensor: return tensor.summary();
    case Kind::kSequence: return "seq<" + std::string(dtype_name(sequence_dtype)) + ">(" +
                                 std::to_string(sequence.size()) + ")";
  }
  return "?";
}

}  // namespace kiln
