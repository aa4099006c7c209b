// Tensors at the API boundary: a TensorView points at memory the caller owns (inputs, and outputs
// written in place); a HostTensor is host memory kiln allocated and hands back (outputs).
//
//   std::vector<int64_t> ids = {101, 2023, 102};
//   kiln::TensorView in{kiln::DType::kInt64, {1, 3}, ids.data()};
//   kiln::HostTensor out = std::move(session->run({in}).value()[0]);
//   for (int64_t i = 0; i < out.numel(); ++i) use(out.data<float>()[i]);
//
// Data is dense and row-major. String tensors hold std::string elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/dtype.h"

namespace kiln {

struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* data = nullptr;     // inputs are only read
  bool on_device = false;   // a CUDA device pointer (GPU engines), else host memory

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
};

class HostTensor {
 public:
  HostTensor() = default;
  // Adopts memory that `owner` keeps alive (kiln's outputs share their buffers this way).
  HostTensor(DType dtype, std::vector<int64_t> shape, std::shared_ptr<void> owner, void* data)
      : dtype_(dtype), shape_(std::move(shape)), owner_(std::move(owner)), data_(data) {}

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype_); }
  void* raw() { return data_; }
  const void* raw() const { return data_; }
  // The elements as T: the caller picks the T that matches dtype() (float for kFloat32...).
  template <typename T>
  T* data() { return static_cast<T*>(data_); }
  template <typename T>
  const T* data() const { return static_cast<const T*>(data_); }
  // A view of this tensor, to pass it back as an input.
  TensorView view() const { return TensorView{dtype_, shape_, data_, false}; }

 private:
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
};

}  // namespace kiln
