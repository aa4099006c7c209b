// The CUDA executor: step records (runtime/device_plan.h) -> closures that enqueue work.
//
// Each step kind has an encoder, used by the lowering that emits it, and a binder, which reads the
// parameters back, creates what the launch needs (cuDNN and cuBLASLt descriptors, a loaded cubin,
// the Hopper GEMM's prepared kernel) and returns the closure. A build binds the records it just
// emitted and a loaded engine binds the records its file holds: one path, so what was built is what
// runs after a load. Binders live beside their lowering (lower_*.cc), which knows the parameters'
// meaning; each checks every buffer reference and reads its parameters to the last byte.
//
//   ByteWriter p;  put(p, x.ref);  put(p, y.ref);  p.i64(n);          // in a lowering
//   L.emit(&n, "kernel cast", {x.ref.id}, {y.ref.id}, StepOp::kCast, std::move(p));
//
//   Expected<StepFn> bind_cast(Params& in, BindCtx&) {                  // its binder
//     Ref x = in.ref(), y = in.ref();  int64_t n = in.i64();
//     KILN_RETURN_IF_ERROR(in.done());
//     return StepFn([=](const RunCtx& c) { ... k::cast(..., c.ptr(x), c.ptr(y), n, c.stream) ... });
//   }
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "backends/cuda/engine.h"
#include "backends/cuda/kernels/kernels.h"
#include "runtime/device_plan.h"

namespace kiln::cuda {

using Ref = ::kiln::DeviceRef;

// The step kinds. Numbers are part of the engine-file format: append, never renumber.
enum class StepOp : uint16_t {
  kHostOp = 1,     // one node on the CPU kernels: inputs copied down, outputs up
  kCast,           // k::cast
  kCastRows,       // k::cast_rows
  kCopyNd,         // k::copy_nd (transpose, slice, expand, concat, split, layout changes, patches)
  kUnary,
  kBinary,
  kWhere,
  kGather,
  kFill,
  kSoftmax,
  kLayerNorm,      // LayerNorm and RMSNorm
  kChannelAffine,
  kReduce,
  kArgReduce,
  kDepthwiseConv,
  kSpaceToDepth,
  kMaxPoolNhwc,
  kCudnnPool,
  kCudnnConv,
  kLtMatmul,
  kGemmSm90,
  kAttention,
  kGenerated,      // an NVRTC-compiled elementwise kernel, by its cubin
  kGroupNorm,      // k::group_norm (GroupNormalization, InstanceNormalization)
  kPad,            // k::pad_nd (Pad: constant, reflect, edge, wrap)
  kResize,         // k::resize (Resize: host-planned taps)
  kCumSum,         // k::cumsum
  kGatherElements, // k::gather_elements
  kCudnnConvTranspose,  // cudnnConvolutionBackwardData (ConvTranspose)
  kTrilu,          // k::trilu
  kGatherND,       // k::gather_nd
  kScatter,        // k::scatter (ScatterND, ScatterElements)
  kTopK,           // k::topk
  kQuantizeAct,    // k::quantize_int8 / quantize_fp8 (QuantizedMatMul's activation)
  kLtMatmulQuant,  // a cuBLASLt int8 or fp8 product
  kDequantCols,    // k::dequant_cols (an int8 product's sums to float)
  kLoss,           // k::loss (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss)
  kArgReduceLast,  // k::arg_reduce with select_last_index=1
  kAllReduce,      // ncclAllReduce (sum) on the session's communicator
  kAllGather,      // ncclAllGather on the session's communicator
  kRowMoments,     // k::row_moments (LayerNormalization's Mean and InvStdDev outputs)
  kRnnStep,        // k::rnn_step (one time step of RNN, GRU or LSTM)
  kGridSample,     // k::grid_sample
  kReverseSequence,  // k::reverse_sequence
  kDet,            // k::det
  kRandom,         // k::random (RandomUniform/Normal(Like), Bernoulli)
  kDynamicQuantize,  // k::dynamic_quantize_u8
  kCudnnLrn,       // cudnnLRNCrossChannelForward
  kCudnnConvNd,    // cudnnConvolutionForward over N-d descriptors (3-D, and 1-D with a fed weight)
  kPoolTable,      // k::pool_table (pooling from a host-planned window table)
  kBatchNormTrain, // k::batch_norm_train (BatchNormalization with batch statistics)
  kDropoutTrain,   // k::dropout_train (Dropout in training mode)
  kCudnnConvTransposeNd,  // cudnnConvolutionBackwardData over N-d descriptors (1-D and 3-D ConvTranspose)
  kCufft,          // cufftExecC2C/Z2Z between k::fft_pack and k::fft_unpack (DFT, STFT)
  kIntCenter,      // k::int_center (an integer operand minus its zero point, as f32/f64)
  kRequantize,     // k::requantize (an exact integer sum to int32, int8 or uint8)
  kRoiAlign,       // k::roi_align
  kConcat,         // k::concat_rows (Concat of inputs laid out like its output)
  kChannelAffineClamp,  // k::channel_affine with a fused Relu or Clip
  kCudnnGraphConv,  // a cuDNN operation graph: convolution + bias + residual + activation (lower_conv_graph.cc)
  kFakeQuant,       // k::fake_quant (QuantizedMatMul's activation when its product runs in 16 bits)
  kGemmSm90Quant,   // k::gemm_sm90_q8 (QuantizedMatMul's 8-bit product on Hopper, dequantized in its epilogue)
  kSqueezeExcite,   // k::squeeze_excite (a squeeze-and-excitation gate: mean, two layers, activations)
  kLast = kSqueezeExcite,
};

// What a step sees when it runs: the session's stream, handles and memory.
struct RunCtx {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  char* arena = nullptr;
  const std::vector<uint64_t>* offsets = nullptr;  // arena offset per buffer id
  const std::vector<void*>* weights = nullptr;     // device pointer per weight id
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int* bad_index = nullptr;  // device counters, one per step that checks indices
  // Device words of the session's own, one per bad-index slot, zeroed once when the session is
  // ready (after its warm-up and capture) and kept across runs: random steps' run counters.
  unsigned long long* counters = nullptr;
  void* comm = nullptr;      // the rank's ncclComm_t in a tensor-parallel session, else null

  void* ptr(Ref r) const { return r.weight ? (*weights)[size_t(r.id)] : arena + (*offsets)[size_t(r.id)]; }
};

using StepFn = std::function<Status(const RunCtx&)>;

// ---- parameters ---------------------------------------------------------------------------------

void put(ByteWriter& w, Ref r);
void put(ByteWriter& w, const k::NdStrides& s);
void put(ByteWriter& w, const std::vector<int64_t>& v);

// A step's parameters being read by its binder: bounds-checked, buffer references checked against
// the plan, and done() fails unless every byte was read.
class Params {
 public:
  Params(const DeviceStep& s, const DevicePlan& p);
  Ref ref();          // a buffer (arena or weight), must exist
  Ref opt_ref();      // the same, or none (id -1)
  int64_t i64() { return r_.get<int64_t>("an integer"); }
  int32_t i32() { return r_.get<int32_t>("an integer"); }
  float f32() { return r_.get<float>("a number"); }
  double f64() { return r_.get<double>("a number"); }
  bool flag() { return r_.get_in<uint8_t>("a flag", 0, 1) != 0; }
  int u8_in(uint8_t hi) { return r_.get_in<uint8_t>("a small integer", 0, hi); }
  k::DT dt();
  template <typename E>
  E en(E last) {  // an enum in [0, last]
    return E(r_.get_in<int32_t>("an enum", 0, int32_t(last)));
  }
  k::NdStrides nd();
  std::vector<int64_t> dims();
  std::string_view bytes() { return r_.view("bytes"); }
  const DeviceStep& step() const { return s_; }
  Status done();  // the error naming the step when anything was malformed or left unread

 private:
  const DeviceStep& s_;
  const DevicePlan& p_;
  ByteReader r_;
  std::string bad_;
};

// ---- binding ------------------------------------------------------------------------------------

struct BindCtx {
  const DevicePlan& plan;
  const Graph* graph = nullptr;  // the plan's graph: host steps run its nodes
  const BuildOptions& opt;
  cudnnHandle_t dnn = nullptr;   // for descriptors that need a handle
  cublasLtHandle_t lt = nullptr;
  // Descriptors, loaded libraries and other resources the closures use; freed with the engine.
  std::vector<std::shared_ptr<void>>& keep_alive;
};

using BindFn = Expected<StepFn> (*)(Params&, BindCtx&);
void register_gemm_binders(std::map<StepOp, BindFn>& t);
void register_conv_binders(std::map<StepOp, BindFn>& t);
void register_elementwise_binders(std::map<StepOp, BindFn>& t);
void register_data_binders(std::map<StepOp, BindFn>& t);
void register_norm_binders(std::map<StepOp, BindFn>& t);
void register_attention_binders(std::map<StepOp, BindFn>& t);
void register_fused_binders(std::map<StepOp, BindFn>& t);
void register_resample_binders(std::map<StepOp, BindFn>& t);
void register_conv_transpose_binders(std::map<StepOp, BindFn>& t);
void register_pool_binders(std::map<StepOp, BindFn>& t);  // lower_pool.cc
void register_rnn_binders(std::map<StepOp, BindFn>& t);   // lower_rnn.cc
void register_classic_binders(std::map<StepOp, BindFn>& t);  // lower_classic.cc
void register_random_binders(std::map<StepOp, BindFn>& t);   // lower_random.cc
void register_conv_nd_binders(std::map<StepOp, BindFn>& t);  // lower_conv_nd.cc
void register_train_mode_binders(std::map<StepOp, BindFn>& t);  // lower_train_mode.cc
void register_fft_binders(std::map<StepOp, BindFn>& t);         // lower_fft.cc
void register_integer_binders(std::map<StepOp, BindFn>& t);     // lower_integer.cc
void register_host_binders(std::map<StepOp, BindFn>& t);
void register_quant_binders(std::map<StepOp, BindFn>& t);  // lower_gemm_quant.cc
void register_loss_binders(std::map<StepOp, BindFn>& t);   // lower_loss.cc
void register_collective_binders(std::map<StepOp, BindFn>& t);  // lower_collective.cc

// Every step of the plan bound, in order; an unknown kind or a malformed record is an error naming
// the step.
Expected<std::vector<StepFn>> bind_plan(BindCtx& ctx);

// Holds a library object with its destroy function in keep_alive.
template <typename T, typename D>
void hold(std::vector<std::shared_ptr<void>>& keep, T p, D destroy) {
  keep.push_back(std::shared_ptr<void>(p, [destroy](void* q) { (void)destroy(static_cast<T>(q)); }));
}

}  // namespace kiln::cuda
