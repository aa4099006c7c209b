// The fast CPU backend's plan: which steps of a host plan run as oneDNN primitives, with which
// epilogue, in which activation layout — decided once at build and written to the engine file (its
// CPUF section), so a loaded engine runs what the build report says.
//
//   Conv -> Clip -> Add(., skip)        one kConv step: convolution, clip post-op, add post-op
//   Conv -> Conv                         the first writes the layout oneDNN prefers (kLibrary)
//   Mul(x, scale[1,C,1,1])               one kBinary step, x read in its producer's layout
//   Concat(conv, conv)                   one kConcat step; all three stay in the blocked layout
//   BatchNormalization -> Relu           one kBatchNorm step (a DenseNet's pre-activation)
//   MatMul -> Add(bias) -> Add(skip)     one kMatMul step (the bias as the GEMM's, the skip a post-op)
//   STFT(signal, step, window)           one kStft step: a oneDNN strided convolution by the DFT basis
//   Sigmoid(x) after a host step         one kEltwise step (oneDNN eltwise), its own eltwise epilogue
//   LSTM(x, W, R, B, _, h0, c0)          one kLstm step (oneDNN's LSTM, weights in its gate order)
//   GroupNormalization -> SiLU           one kGroupNorm step (batch norm statistics, binary affine, swish)
//   anything else                        a kHost step: the plan's step on the reference kernels
//
// A step's epilogue nodes (post-ops) each had one reader, the node before them, and are not graph
// outputs; the step runs where its last node stood, so every operand is ready. A value stays in
// oneDNN's own layout only while every reader is a oneDNN convolution, pooling, concat, batch norm or binary src0, so host steps
// (and graph outputs) always see plain row-major tensors.
//
//   KILN_ASSIGN_OR_RETURN(CpuPlan cp, plan_fast_cpu(plan));
//   std::string bytes = write_cpu_plan(cp);                 // the CPUF section
//   KILN_ASSIGN_OR_RETURN(CpuPlan back, read_cpu_plan(bytes, plan, "model.kiln"));
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/plan.h"

namespace kiln {

enum class CpuStepKind : uint8_t {
  kHost,    // a step of the host plan, on the reference kernels
  kConv,    // Conv (1-3 spatial dims, fp32, constant weight and bias)
  kMatMul,  // MatMul or Gemm by a constant 2-D weight (fp32), bias and epilogue fused
  kPool,    // MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (fp32)
  kAttention,  // Attention of 4-D Q/K/V (fp32, additive or no mask): two matmuls and a softmax
  kNorm,       // LayerNormalization over the last axis (fp32, constant scale and bias)
  kTranspose,  // Transpose (fp32, rank 2-6): a oneDNN reorder into the permuted layout
  kBinary,     // Add, Sub, Mul, Div of a full-shape input and a broadcast one (fp32): oneDNN binary
  kBatchMatMul,  // MatMul of two computed operands (fp32, batch dims broadcast): attention's Q K^T
  kConcat,       // Concat (fp32, rank 1-6): oneDNN concat, its inputs and result in the library layout
  kBatchNorm,    // BatchNormalization (inference, constant statistics) and a following Relu: oneDNN's
  kDeconv,       // ConvTranspose (1-3 spatial dims, fp32, constant weight and bias, explicit pads)
  kStft,         // STFT of a real signal (fp32, constant frame step, length and window): one strided
                 // 1-D convolution by the DFT basis with the window in it
  kEltwise,      // a unary elementwise op on its own, or a FusedElementwise chain of them (fp32; the
                 // ops post-ops take, and Pow by a constant): oneDNN eltwise, row-major in and out
  kLstm,         // LSTM (fp32, constant weights, default activations, no clip, peepholes or
                 // sequence lengths, layout 0; Y_h and Y_c unread): oneDNN's LSTM
  kGroupNorm,    // GroupNormalization or InstanceNormalization (fp32, constant scale and bias): oneDNN
                 // batch norm over [1, batch x groups, group] for the statistics, then a binary for the
                 // per-channel scale and bias, the elementwise ops after it (SiLU) as its post-ops
  kResample,     // Resize (fp32): linear with half-pixel centres, or nearest by whole factors with
                 // asymmetric floor (what PyTorch's interpolate exports): oneDNN resampling
  kFused,        // a FusedElementwise that is no chain of eltwise ops (fp32 body, scalar constants):
                 // one blocked loop over the output (fast_fused.h), not oneDNN
  kRmsNorm,      // RMSNormalization over the last axis (fp32, constant scale of that axis): kiln's
                 // loop (oneDNN 3.2 has no RMS norm)
  kSoftmax,      // Softmax or LogSoftmax on its own (fp32): oneDNN softmax
  kSlice,        // Slice (fp32, constant starts, ends and axes, steps of 1): a oneDNN reorder from the
                 // sub-block of its input
  kGru,          // GRU under kLstm's conditions (either linear_before_reset): oneDNN's GRU
};
std::string_view cpu_step_kind_name(CpuStepKind k);
// A kBinary node's input of the output's own dims, which oneDNN reads as src0 (in whatever layout
// its producer wrote): input 0 when both are, input 1 when only it is (Mul(scale, x)).
size_t binary_src0(const Node& n);

// An elementwise op applied to a primitive's result, in order (a oneDNN post-op).
enum class CpuPostKind : uint8_t {
  kRelu, kLeakyRelu, kClip, kSigmoid, kTanh, kElu, kHardSigmoid, kHardSwish, kGeluErf, kGeluTanh, kSwish,
  kSoftplus, kMish,
  kAdd,  // + another tensor of the result's shape (a residual)
  kPow,  // x ^ beta, a constant exponent (a power spectrum's square)
};
inline constexpr uint8_t kCpuPostKindLast = uint8_t(CpuPostKind::kPow);

struct CpuPostOp {
  CpuPostKind kind = CpuPostKind::kRelu;
  float alpha = 0, beta = 0;  // the op's parameters (Clip: min, max; LeakyRelu: slope...)
  uint32_t node = 0;          // the graph node it came from
  int32_t operand = -1;       // kAdd: index into CpuStep::reads of the other tensor
  bool operator==(const CpuPostOp&) const = default;
};

// How a value produced by a oneDNN step is laid out: row-major, or the blocked layout the
// primitive chose for this machine (the executor knows its descriptor; only oneDNN steps read it).
enum class CpuLayout : uint8_t { kPlain, kLibrary };

struct CpuStep {
  CpuStepKind kind = CpuStepKind::kHost;
  uint32_t index = 0;              // kHost: the host plan's step; else the primitive's node
  std::vector<CpuPostOp> post;
  std::vector<ValueRef> reads;     // not kHost: the node's inputs, then the post-ops' operands
  ValueRef out;                    // not kHost: the slot the last node's output goes to
  CpuLayout out_layout = CpuLayout::kPlain;
  std::vector<uint32_t> frees;     // slots released after this step
  bool operator==(const CpuStep&) const = default;
};

struct CpuPlan {
  std::vector<CpuStep> steps;
};

// Decides the steps over a host plan (whose graph must have static shapes where a primitive is
// chosen; anything else stays a host step). `deterministic` (BuildConfig::deterministic): no step
// whose result depends on how oneDNN splits it across threads (kGroupNorm's statistics).
Expected<CpuPlan> plan_fast_cpu(const Plan& p, bool deterministic = false);

std::string write_cpu_plan(const CpuPlan& cp);
// Reads it and checks it is the plan plan_fast_cpu makes for `p` (a damaged section, or one from
// another kiln, is an error before anything runs). `name` (the file) starts every error.
Expected<CpuPlan> read_cpu_plan(std::string_view bytes, const Plan& p, const std::string& name, bool deterministic = false);

// n as elementwise ops applied in turn to its first input, as post-ops would apply them (never
// kAdd): one op, or a FusedElementwise body that is a chain of them (SiLU, Mul(x, Sigmoid(x)), as
// one swish); empty when oneDNN has no such ops. The kEltwise step's own ops.
std::vector<CpuPostOp> eltwise_ops(const Node& n);

// "Conv + clip + add" for the report.
std::string describe_cpu_step(const CpuStep& s, const Plan& p);

}  // namespace kiln
