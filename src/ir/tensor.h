// Tensor: a dense, row-major, host-memory array with a dtype and static dims; the unit of data
// for initializers, the CPU backend and I/O. Copies share the buffer (like a shared_ptr); clone()
// makes a deep copy. Data is the runtime value of an IR Value: a tensor, a sequence of tensors,
// or an empty optional.
//
//   KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(DType::kFloat32, {2, 3}));
//   float* p = t.data<float>();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/dtype.h"
#include "support/status.h"

namespace kiln {

// Allocations above this many bytes are refused with kOutOfMemory instead of attempted.
int64_t max_tensor_bytes();
void set_max_tensor_bytes(int64_t bytes);

// Product of dims, or an error naming what is wrong (negative dim, overflow).
Expected<int64_t> checked_numel(const std::vector<int64_t>& dims);

class Tensor {
 public:
  Tensor() = default;  // undefined tensor

  // Zero-filled (strings empty). Fails on negative dims, overflow, or more than max_tensor_bytes().
  static Expected<Tensor> create(DType dtype, std::vector<int64_t> dims);
  // Views memory owned by `owner` (e.g. a mapped external-data file); no copy. Not for strings.
  static Tensor view(DType dtype, std::vector<int64_t> dims, std::shared_ptr<void> owner, void* data);
  template <typename T>
  static Tensor scalar(T v) {
    Tensor t = create(dtype_of<T>(), {}).value();
    *t.data<T>() = v;
    return t;
  }
  template <typename T>
  static Tensor from_vector(const std::vector<T>& v, std::vector<int64_t> dims) {
    Tensor t = create(dtype_of<T>(), std::move(dims)).value();
    for (size_t i = 0; i < v.size() && int64_t(i) < t.numel(); ++i) t.data<T>()[i] = v[i];
    return t;
  }

  bool defined() const { return data_ != nullptr || numel_ == 0; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t dim(size_t i) const { return dims_[i]; }
  size_t rank() const { return dims_.size(); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }

  template <typename T>
  T* data() {
    KILN_CHECK(dtype_of<T>() == dtype_, "tensor is {}", dtype_name(dtype_));
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* data() const {
    KILN_CHECK(dtype_of<T>() == dtype_, "tensor is {}", dtype_name(dtype_));
    return static_cast<const T*>(data_);
  }
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Same buffer, other dims with the same element count.
  Tensor reshaped(std::vector<int64_t> dims) const;
  Tensor clone() const;
  // Element i converted to double / int64 (for shape tensors, indices, scalars of any numeric type).
  double as_double(int64_t i) const;
  int64_t as_int(int64_t i) const;
  std::vector<int64_t> to_int_vector() const;
  std::string summary() const;  // "f32[2,3]"

 private:
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> dims_;
  int64_t numel_ = 0;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
};

std::string dims_to_string(const std::vector<int64_t>& dims);

// The runtime value of an IR Value.
struct Data {
  enum class Kind { kNone, kTensor, kSequence };
  Kind kind = Kind::kNone;        // kNone: an optional without a value
  Tensor tensor;
  std::vector<Tensor> sequence;
  DType sequence_dtype = DType::kFloat32;  // element type, meaningful for empty sequences too

  Data() = default;
  Data(Tensor t) : kind(Kind::kTensor), tensor(std::move(t)) {}  // NOLINT
  static Data make_sequence(std::vector<Tensor> items, DType dt) {
    Data d;
    d.kind = Kind::kSequence;
    d.sequence = std::move(items);
    d.sequence_dtype = dt;
    return d;
  }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_none() const { return kind == Kind::kNone; }
  std::string summary() const;
};

}  // namespace kiln
