// Training-mode forms of BatchNormalization and Dropout (train_mode.cu), for graphs exported with
// training_mode set (and ONNX's conformance tests): kiln runs them forward as the CPU reference does.
#pragma once

#include "backends/cuda/kernels/kernels.h"

namespace kiln::cuda::k {

// BatchNormalization with batch statistics over x [n, c, plane] (dt: f32/f16/bf16/f64): per channel
// the mean and biased variance over n and the plane (in f64), y = (x - mean) / sqrt(var + eps) *
// scale + bias; running_mean/var (may be null) = input_mean/var * momentum + batch * (1 - momentum).
// scale and bias are of param_dt, input and running statistics of stat_dt (float types);
// scratch holds 2 * c doubles. mvn: MeanVarianceNormalization over every axis but the channel's,
// y = (x - mean) / (sqrt(var) + eps), no scale, bias or statistics.
struct BatchNormTrain {
  DT dt = DT::kF32, param_dt = DT::kF32, stat_dt = DT::kF32;
  int64_t n = 0, c = 0, plane = 0;
  double eps = 1e-5, momentum = 0.9;
  bool mvn = false;
  const void *x = nullptr, *scale = nullptr, *bias = nullptr, *mean = nullptr, *var = nullptr;
  void *y = nullptr, *running_mean = nullptr, *running_var = nullptr;
  double* scratch = nullptr;
};
cudaError_t batch_norm_train(const BatchNormTrain& a, cudaStream_t s);

// Dropout in training mode over n elements of x (dt: f32/f16/bf16/f64): element i is kept when
// draws[i] (uniform in [0, 1)) >= ratio and scaled by 1 / (1 - ratio), else 0; mask (may be null)
// says which were kept. ratio is read from `ratio` (ratio_dt, one element) when given, else
// ratio_value; training from `training` (one bool) when given, else training_value. Outside
// training, or with ratio 0, y = x and the mask is all true.
struct DropoutTrain {
  DT dt = DT::kF32, ratio_dt = DT::kF32;
  int64_t n = 0;
  const void* x = nullptr;
  const double* draws = nullptr;
  const void* ratio = nullptr;
  double ratio_value = 0.5;
  const void* training = nullptr;
  bool training_value = true;
  void* y = nullptr;
  void* mask = nullptr;
  int* bad = nullptr;  // counts a training run whose ratio is outside [0, 1) (its outputs are then 0)
};
cudaError_t dropout_train(const DropoutTrain& a, cudaStream_t s);

}  // namespace kiln::cuda::k
