// Lowering a graph to CUDA steps: the state shared by the per-family lowering files
// (lower_gemm.cc, lower_conv.cc, lower_elementwise.cc, lower_data.cc, lower_norm.cc).
//
// Every IR value that lives on the device becomes a DevValue: a buffer (in the activation arena
// or among the uploaded weights), a device dtype (f32 values become f16/bf16 in half builds) and
// a layout. A lowering function first checks that it can lower the node, returning kUnsupported
// with a reason before it emits anything (the node then runs on the CPU), and then emits step
// records (runtime/device_plan.h): a kind, plain parameters and buffer references. The executor
// (executor.h) turns each record into a closure that enqueues work given a RunCtx, the same way for
// a fresh build and for an engine loaded from a file. Buffers are referred to by Ref and resolved
// at run time, because each Session has its own arena.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/engine.h"
#include "backends/cuda/executor.h"
#include "backends/cuda/kernels/kernels.h"
#include "backends/cuda/tuning.h"
#include "runtime/copy_compose.h"

namespace kiln::cuda {

// NHWC: a rank-4 value whose logical dims stay [N,C,H,W] but whose bytes are ordered N,H,W,C
// (cuDNN's fast layout for half precision convolution).
enum class Layout { kRowMajor, kNHWC };

struct DevValue {
  Ref ref;
  k::DT dt = k::DT::kF32;
  DType ir_dtype = DType::kFloat32;
  std::vector<int64_t> dims;  // logical (IR) dims
  Layout layout = Layout::kRowMajor;
  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * size_t(k::dt_size(dt)); }
  // Element strides of the logical dims in this value's memory (NHWC-aware).
  std::vector<int64_t> strides() const;
};

// The arena buffer a step reads for d, or -1 for none (an uploaded weight, or no value): what
// Lowering::emit's `reads` take.
inline int read_id(const DevValue* d) { return d && !d->ref.weight ? d->ref.id : -1; }
inline bool is_float_dt(k::DT d) { return d == k::DT::kF32 || d == k::DT::kF16 || d == k::DT::kBF16; }
inline bool is_int_dt(k::DT d) {
  return d == k::DT::kI64 || d == k::DT::kI32 || d == k::DT::kI16 || d == k::DT::kI8 || d == k::DT::kU8 ||
         d == k::DT::kU16 || d == k::DT::kU32 || d == k::DT::kU64;
}


// A step as lowering emits it: the record, plus what only the build needs.
struct Step : DeviceStep {
  bool drop_if_unread = false;  // a conversion (an input's cast) that no later step may need
};

class Lowering;

// The values of g that n's subgraph bodies read (ONNX outer-scope references), nested bodies
// included, each once, in a fixed order (lower_host.cc).
std::vector<const Value*> outer_reads(const Graph& g, const Node& n);

// What a copy_nd step does, kept beside its record so that compose_copy_steps can rewrite it.
struct CopyRecord {
  int eb = 0;
  Ref src, dst;
  StridedCopy copy;
  size_t zero_bytes = 0;
};

// dst[dst_off + idx . d] = src[src_off + idx . s] for idx in s.dims (offsets in elements of eb
// bytes); zero_bytes > 0 first zeroes that many bytes of dst (a padded copy). lower_data.cc.
void emit_copy_nd(Lowering& L, const Node* n, std::string label, int eb, Ref src, int64_t src_off, const k::NdStrides& s,
                  Ref dst, int64_t dst_off, const k::NdStrides& d, size_t zero_bytes = 0);

// Where every reader of a buffer one copy_nd step wrote is a copy_nd step whose reads compose with
// it (runtime/copy_compose.h), the readers read that copy's source instead and it is marked to be
// dropped; `pinned` buffers (the outputs) are left alone. Before drop_unread_steps (compose_copies.cc).
void compose_copy_steps(Lowering& L, const std::vector<bool>& pinned);
// A copy_nd step's parameters (lower_data.cc).
ByteWriter encode_copy(const CopyRecord& c);

// y = op(x) over count elements, x and y of dtype dt (lower_elementwise.cc).
void emit_unary(Lowering& L, const Node* n, std::string label, k::Unary op, k::DT dt, Ref x, Ref y, int64_t count,
                k::UnaryParams p = {});

// count elements of dtype dt at r set to `value` (the kFill record; lower_data.cc).
void emit_fill(Lowering& L, const Node& n, std::string label, k::DT dt, Ref r, int64_t count, double value);

// A k::pad_nd step (lower_resample.cc): y (out dims) = x (in dims) placed at `begin` per dim
// (negative: cropped), the border filled by mode 0 constant (value_bits, the element's bits),
// 1 reflect, 2 edge or 3 wrap.
void emit_pad(Lowering& L, const Node& n, std::string label, int elem_bytes, Ref x, Ref y,
              const std::vector<int64_t>& in, const std::vector<int64_t>& out, const std::vector<int64_t>& begin,
              int mode, uint64_t value_bits);

// A k::scatter step (lower_data.cc): y = data (the same buffer: no copy) with the updates upd written
// or combined (reduction 0 none, 1 add, 2 mul, 3 max, 4 min) at idx's indices; out-of-range
// indices (negative ones too unless wrap_negative) counted in the step's bad-index slot.
void emit_scatter(Lowering& L, const Node& n, std::string label, k::DT dt, Ref data, int64_t data_numel,
                  const DevValue* idx, Ref upd, int64_t upd_numel, Ref y, bool elements, int64_t nr_or_axis,
                  const k::IndexTuple& t, int64_t n_axis, int64_t inner, int reduction, bool wrap_negative = true);

// y = (to)x over count elements (lower_elementwise.cc).
void emit_cast(Lowering& L, const Node* n, std::string label, k::DT from, k::DT to, Ref x, Ref y, int64_t count);

// Softmax (log: LogSoftmax) of x viewed as [rows, cols] along cols (lower_norm.cc); zero_masked:
// rows of nothing but -inf give zeros (an Attention's fully masked rows).
void emit_softmax(Lowering& L, const Node* n, std::string label, k::DT dt, Ref x, Ref y, int64_t rows, int64_t cols,
                  bool log, bool zero_masked = false);

// y[idx] = a[idx . sa] op b[idx . sb] over sa.dims, y contiguous (lower_elementwise.cc).
void emit_binary_nd(Lowering& L, const Node* n, std::string label, k::Binary op, k::DT dt, Ref a, const k::NdStrides& sa,
                    Ref b, const k::NdStrides& sb, Ref y);

// A value's dims, all static (a lowering's precondition), or kUnsupported naming it.
Expected<std::vector<int64_t>> exact_dims(const Value* v);

// Makes a k::NdStrides from dims and strides (rank <= kMaxRank, checked by the caller).
k::NdStrides nd(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides);
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& dims);
// The product of d[from, to) (lower_data.cc).
int64_t prod_of(const std::vector<int64_t>& d, size_t from, size_t to);
// Strides of `v` read as broadcast into `out_dims` (numpy rules; 0 for broadcast dims).
std::vector<int64_t> broadcast_strides(const DevValue& v, const std::vector<int64_t>& out_dims);
std::optional<k::DT> to_kdt(DType d);
DType ir_dtype_of(k::DT d);
// A host copy of t in dtype `to` (ONNX Cast semantics), for weights and CPU-fallback I/O.
Expected<Tensor> convert_tensor(const Tensor& t, DType to);

// An activation (Clip, HardSwish, LeakyRelu) whose only reader, a depthwise Conv, applies it while
// reading x (find_conv_input_acts).
struct InputAct {
  const Value* x = nullptr;
  k::DwInput act = k::DwInput::kNone;
  float a = 0, b = 0;
};

// An Add in front of a GroupNorm of a value broadcast per image and channel, applied by the norm
// as it reads x (find_norm_input_bias): `stride` elements of `bias` per image, 0 for one shared.
struct NormInputBias {
  const Node* add = nullptr;
  const Value* x = nullptr;
  const Value* bias = nullptr;
  int64_t stride = 0;
};

struct AttentionMatch;  // lower_attention.cc

// A squeeze-and-excitation gate found whole (lower_squeeze_excite.cc): the spatial mean of x
// [n, c, spatial...], two fully connected layers (host f32 weights w1 [cr, c] and w2 [c, cr],
// biases possibly empty) and their activations; `nodes` in order, the root (writing `out`) last.
struct SqueezeExcite {
  const Value* x = nullptr;
  const Value* out = nullptr;
  int64_t n = 0, c = 0, cr = 0, spatial = 0;
  Tensor w1, b1, w2, b2;
  k::Unary act1 = k::Unary::kIdentity, act2 = k::Unary::kIdentity;
  k::UnaryParams p1, p2;
  std::vector<const Node*> nodes;
};

// A multi-node pattern run by one lowering, rooted where its output is written; `fused` are the
// nodes it swallows. An Attention node as the fused kernel (the node, or a head Transpose after
// it: lower_attention.cc), or a squeeze-excite gate.
struct Replacement {
  std::vector<const Node*> fused;
  std::shared_ptr<const AttentionMatch> attention;
  std::shared_ptr<const SqueezeExcite> squeeze_excite;
};

// Device scratch for build-time timing, freed on every path.
struct Scratch {
  void* p = nullptr;
  ~Scratch() { if (p) cudaFree(p); }
};

// The Hopper GEMM's fastest tile width for a shape (lower_gemm_sm90.cc); ms per launch as tuning.h
// times it, < 0 when no tile could run.
struct GemmSm90Choice {
  int bn = 0;
  float ms = -1;
};

class Lowering {
 public:
  Lowering(const Graph& g, const BuildOptions& opt);

  const Graph& graph() const { return g_; }
  const BuildOptions& options() const { return opt_; }
  // The device dtype for an IR dtype in this build (f32 -> f16/bf16 in half builds).
  std::optional<k::DT> device_dt(DType d) const;
  bool half() const { return opt_.precision == Precision::kFp16 || opt_.precision == Precision::kBf16; }

  // Host value of a constant (initializer, Constant, or folded at build time), else null.
  const Tensor* constant(const Value* v) const;
  void set_constant(const Value* v, Tensor t) { consts_[v] = std::move(t); }
  // Values read by nodes that have not been lowered yet (for fusion: single-consumer checks).
  int consumers(const Value* v) const;
  const std::vector<const Node*>& readers(const Value* v) const;  // one entry per input use
  bool is_graph_output(const Value* v) const;
  const Node* only_consumer(const Value* v) const;  // the one consumer, if exactly one and not an output

  // The lowered value (uploading a constant on first use); null when `v` has no device value.
  Expected<const DevValue*> value(const Value* v);
  // The value in row-major layout (a converted copy is made once and cached).
  Expected<const DevValue*> rowmajor(const Value* v);
  Expected<const DevValue*> nhwc(const Value* v);
  // A fresh arena buffer for v (IR dims, device dtype of v's IR dtype unless `dt` is given).
  const DevValue& define(const Value* v, Layout layout = Layout::kRowMajor, std::optional<k::DT> dt = std::nullopt);
  // v shares src's buffer (Reshape, Squeeze, Identity...): row-major src only.
  void define_alias(const Value* v, const DevValue& src);
  // A new arena buffer not tied to an IR value (temporaries); returns its id.
  int scratch(size_t bytes);
  // Uploads a host tensor as a weight in device dtype dt (converted on the host).
  Expected<Ref> upload(const Tensor& t, k::DT dt);
  Expected<Ref> upload_raw(const void* data, size_t bytes);
  // Uploads `make()`, a rearrangement of graph constant `src` named `form` (with the parameters it
  // depends on), in device dtype dt. A dynamic engine's shape plans share one copy, made once: the
  // weight pool finds it by src's identity and the form.
  Expected<Ref> upload_derived(const Tensor& src, std::string_view form, k::DT dt,
                               const std::function<Expected<Tensor>()>& make);
  // A graph constant (or a tensor a lowering made) as is, in device dtype dt.
  Expected<Ref> upload_constant(const Tensor& t, k::DT dt);
  // The host bytes of weight `id` as uploaded (device dtype and layout).
  std::string_view weight_host(int id) const;

  // Appends a step record: kind `op` with its parameters (written by the kind's encoder in
  // executor.h). `reads`: arena buffers it reads (-1 entries, weights, are skipped).
  void emit(const Node* n, std::string impl, std::vector<int> reads, std::vector<int> writes, StepOp op,
            ByteWriter params, bool host = false);
  int new_bad_index_slot() { return bad_index_slots_++; }
  // Whether the last emitted step triggers its dependents early (Step::triggers_dependents): a
  // kernel emitted now gains from programmatic serialization, if it waits before its first access.
  bool follows_trigger() const { return !steps.empty() && steps.back().triggers_dependents; }
  void mark_fused(const Node* n, const Node* into);  // n needs no step of its own (into's cover it)
  // Drops the steps from index `first` on, with their copy records (a lowering that declined).
  void drop_steps_from(size_t first);
  bool is_fused(const Node* n) const { return fused_.count(n) != 0; }
  const Node* fused_into(const Node* n) const {
    auto it = fused_.find(n);
    return it == fused_.end() ? nullptr : it->second;
  }

  // Results, read by the engine after lowering.
  std::vector<Step> steps;
  std::vector<size_t> buffer_bytes;        // per arena buffer id
  std::vector<uint8_t> buffer_dtype;       // per arena buffer id: the value's k::DT, or kNoDtype (scratch)
  std::vector<std::vector<char>> weight_data;  // per weight id, host bytes to upload
  std::vector<int32_t> pooled;                 // with options().weight_pool: its id per weight id
  std::unordered_map<const Value*, DevValue> values;
  std::unordered_map<size_t, CopyRecord> copy_records;  // per copy_nd step index (emit_copy_nd)
  // Graph inputs converted to the build's dtype by a first step: the value as the host staged it
  // (a lowering that reads it directly, like the f32 image of space-to-depth, saves the pass).
  std::unordered_map<const Value*, DevValue> staged_inputs;
  std::unordered_map<const Node*, Replacement> replacements;  // root node -> pattern
  std::unordered_map<const Node*, InputAct> input_acts;       // depthwise Conv -> its fused input activation
  std::unordered_map<const Node*, NormInputBias> norm_input_bias;  // GroupNorm -> the Add fused in front
  int bad_index_slots() const { return bad_index_slots_; }
  int node_index(const Node* n) const;  // position in the graph's top-level nodes, -1 if none

  // Build-time resources of autotuning (cuDNN descriptors, Lt layouts), freed with the lowering.
  std::vector<std::shared_ptr<void>> keep_alive;
  cudnnHandle_t dnn = nullptr;         // build-time handle for algorithm search
  cublasLtHandle_t lt = nullptr;
  void* build_workspace = nullptr;     // device scratch for autotuning, opt.workspace_bytes
  std::map<std::string, cublasLtMatmulAlgo_t> gemm_algos;  // chosen per GEMM shape + epilogue
  std::map<std::string, float> gemm_algo_ms;                // the chosen algorithm's timing (autotuned)
  std::map<std::string, std::string> quant_forms;           // QuantizedMatMul: 8-bit or 16-bit, per shape
  std::map<std::string, int> fake_quants;                   // x quantized and dequantized, per x and scale
  std::map<std::string, GemmSm90Choice> gemm_sm90_choices;  // Hopper GEMM tile, timed per shape + epilogue
  std::map<int, Ref> weights_kn;                           // [N,K] weight id -> its [K,N] copy (Hopper GEMM)

 private:
  const Graph& g_;
  BuildOptions opt_;
  std::unordered_map<const Value*, Tensor> consts_;
  std::unordered_map<const Value*, DevValue> converted_;  // NHWC <-> row-major copies
  std::unordered_map<const Node*, const Node*> fused_;
  std::unordered_map<const Node*, int> node_index_;  // top-level position, for host steps
  std::unordered_map<const Value*, std::vector<const Node*>> readers_;
  int bad_index_slots_ = 0;
  Expected<const DevValue*> convert(const Value* v, Layout to);
};

// Lowers one node; kUnsupported means "run it on the CPU": steps it emitted before declining are
// dropped by the engine, but fused nodes must be marked only once the lowering is certain. Each
// family file registers its ops.
using LowerFn = Status (*)(Lowering&, const Node&);
void register_gemm_lowerings(std::map<OpKind, LowerFn>& t);
void register_conv_lowerings(std::map<OpKind, LowerFn>& t);
void register_elementwise_lowerings(std::map<OpKind, LowerFn>& t);
void register_data_lowerings(std::map<OpKind, LowerFn>& t);
void register_norm_lowerings(std::map<OpKind, LowerFn>& t);
void register_attention_lowerings(std::map<OpKind, LowerFn>& t);
void register_fused_lowerings(std::map<OpKind, LowerFn>& t);  // lower_fused.cc: generated kernels
void register_resample_lowerings(std::map<OpKind, LowerFn>& t);  // lower_resample.cc: Pad, Resize
void register_quant_lowerings(std::map<OpKind, LowerFn>& t);  // lower_gemm_quant.cc: QuantizedMatMul
void register_loss_lowerings(std::map<OpKind, LowerFn>& t);   // lower_loss.cc: NLL and SCE losses
void register_collective_lowerings(std::map<OpKind, LowerFn>& t);  // lower_collective.cc: NCCL
const std::map<OpKind, LowerFn>& lowering_table();
// Finds the multi-node patterns (attention, activations into depthwise convs, Add into GroupNorm,
// squeeze-excite gates) before lowering; lower_replacement lowers a root.
void find_patterns(Lowering& L);
Status lower_replacement(Lowering& L, const Node& n, const Replacement& r);
// Attention nodes (and the views feeding them) -> one fused kernel (lower_attention.cc).
void find_attention(Lowering& L);
// Depthwise convolutions (lower_conv_depthwise.cc): whether lower_conv takes that path for n (it
// then cannot decline the node), the activations found in front of them, the lowering of n with
// its input x in NHWC (in_act: the fused activation, or null), and the step's binder.
bool depthwise_candidate(Lowering& L, const Node& n);
void find_conv_input_acts(Lowering& L);
Status lower_depthwise(Lowering& L, const Node& n, const DevValue& x, const InputAct* in_act);
void register_depthwise_binder(std::map<StepOp, BindFn>& t);
// The bytes arena buffer r of plan p holds, for binders checking an engine file's sizes; -1 for a
// weight (the plan's host copies are gone once the device holds them: weights go unmeasured).
int64_t held_bytes(const DevicePlan& p, Ref r);
// Helpers of lower_conv.cc: 2-D pads [top, left, bottom, right] (auto_pad NOTSET/VALID only), and
// the nodes computing v * sigmoid(v) from v when nothing else reads v (empty otherwise).
std::optional<std::array<int64_t, 4>> pads4(const Node& n);
std::vector<const Node*> silu_after(Lowering& L, const Value* v);
// A 2-D convolution of K output channels, K not a multiple of 8, lowered by `lower` as one of K
// rounded up to 8 (zero filters made at build) and then a copy of its first K channels
// (lower_conv_pad.cc). False, with nothing emitted, where the padded convolution declines.
Expected<bool> lower_conv_padded_k(Lowering& L, const Node& n, const Tensor& w, const Tensor* bias,
                                   const std::function<Status(const Node&)>& lower);
void find_norm_input_bias(Lowering& L);   // lower_norm.cc
void find_squeeze_excite(Lowering& L);    // lower_squeeze_excite.cc
Status lower_squeeze_excite(Lowering& L, const Node& root, const SqueezeExcite& m);
void register_squeeze_excite_binder(std::map<StepOp, BindFn>& t);
Status lower_attention(Lowering& L, const Node& root, const AttentionMatch& m);

// A cuBLASLt matmul, row-major: y = act(alpha * a.b + beta * c + bias). Used by MatMul/Gemm and
// by 1x1 convolutions in NHWC (which are exactly a GEMM over N*H*W rows).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // row-major: A [m,k] (or [k,m] when trans_a), B [k,n] (or [n,k])
  bool trans_a = false, trans_b = false;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_d = 0;  // elements
};

// The activation a GEMM or convolution applies in its epilogue.
enum class Act { kNone, kRelu, kGelu };
std::string_view act_name(Act a);  // "", "relu", "gelu"

struct Epilogue {
  const DevValue* bias = nullptr;  // [n] in the output dtype
  Act act = Act::kNone;
  const DevValue* c = nullptr;     // full [m,n] addend (Gemm's C), scaled by beta
  float alpha = 1, beta = 0;
};

// Build-time timing scratch for kiln's 16-bit product kernel on shape s (time_sm90):
// the rotating operands (tuning.h), an output and a bias of 1.06s. ok() is false when an allocation
// failed (the candidates are then not timed).
struct ProductScratch {
  ProductScratch(const GemmShape& s, bool has_c);
  bool ok() const { return ok_; }
  ProductOperands op;
  Scratch d, bias;

 private:
  bool ok_ = false;
};

Status emit_gemm(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s,
                 const Epilogue& ep, Ref y, k::DT dt);
// What follows a product (its bias applied) and can join its epilogue: a residual Add of a value
// already computed (cuBLASLt's C), then a Relu or Gelu, each the only reader of what it reads.
// Fills ep and `fused` (the nodes to mark fused once the product is emitted) and returns the value
// the chain produces (`out` when nothing joins).
const Value* fuse_product_tail(Lowering& L, const Value* out, k::DT dt, Epilogue& ep, std::vector<const Node*>& fused);
// The residual Add alone (fuse_product_tail's first step), for epilogues without the activation.
const Value* fuse_residual(Lowering& L, const Value* out, k::DT dt, Epilogue& ep, std::vector<const Node*>& fused);
// The milliseconds per launch of the cuBLASLt algorithm emit_gemm would take for (s, ep, dt), timing
// the candidates now if nothing has (the choice is kept: emit_gemm with the same epilogue then times
// nothing); -1 when not timed. Only whether ep has a bias, a C and which activation matter.
Expected<float> gemm_ms(Lowering& L, const GemmShape& s, const Epilogue& ep, k::DT dt);
// MatMul's product of row-major a and b as one GEMM (or one batched GEMM): a [..., M, K] by [K, N]
// folds the batch into M; equal batch dims, or a batch of one on either side, stride through it.
Expected<GemmShape> matmul_gemm_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// The 16-bit weight w, held on the host as a row-major [rows, cols] matrix, transposed to [cols, rows]
// and uploaded once; `cache` maps w's id to the copy (the Hopper GEMM wants B[K,N]).
Expected<Ref> transposed_weight(Lowering& L, const DevValue* w, int64_t rows, int64_t cols, std::map<int, Ref>& cache);

// The Hopper GEMM (CUTLASS, programmatic dependent launch) instead of cuBLASLt when it applies and
// its build-time timing beats lt_ms (cuBLASLt's chosen algorithm, same method; <= 0: not timed, keep
// cuBLASLt). True when it emitted the step, which triggers its dependents early; when it was timed
// and lost, `lost` says by how much, for the build report (lower_gemm_sm90.cc).
Expected<bool> try_emit_gemm_sm90(Lowering& L, const Node& n, const DevValue* a, const DevValue* b, const GemmShape& s,
                                  const Epilogue& ep, Ref y, k::DT dt, float lt_ms, std::string* lost);

void register_gemm_sm90_binder(std::map<StepOp, BindFn>& t);  // lower_gemm_sm90.cc
// cuDNN descriptors of one 2-D convolution x (xdims) * w (wdims, [K, C/group, R, S]) -> y (ydims), in
// the layout lay, held in `keep` (lower_conv.cc); key is the timing cache's signature of it.
struct ConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t c = nullptr;
  size_t xb = 0, wb = 0, yb = 0;  // bytes
  std::string key;
};
Expected<ConvDescs> make_conv_descs(std::vector<std::shared_ptr<void>>& keep, Precision prec, size_t workspace, k::DT dt,
                                    Layout lay, const std::vector<int64_t>& xdims, const std::array<int64_t, 4>& wdims,
                                    std::array<int, 2> pads, std::array<int, 2> stride, std::array<int, 2> dil,
                                    int64_t group, const std::vector<int64_t>& ydims);
Expected<cudnnTensorDescriptor_t> make_tensor_desc(std::vector<std::shared_ptr<void>>& keep, const std::vector<int64_t>& d,
                                                   k::DT dt, Layout lay);
// A [K, C, R, S] filter as [K, R, S, C] (cuDNN's NHWC filter layout).
Expected<Tensor> filter_krsc(const Tensor& w);
void register_conv_transpose_lowerings(std::map<OpKind, LowerFn>& t);  // lower_conv_transpose.cc
void register_pool_lowerings(std::map<OpKind, LowerFn>& t);            // lower_pool.cc: Max/AveragePool
void register_rnn_lowerings(std::map<OpKind, LowerFn>& t);             // lower_rnn.cc: RNN, GRU, LSTM
void register_classic_lowerings(std::map<OpKind, LowerFn>& t);  // lower_classic.cc: ReverseSequence, Det, MaxUnpool, LRN
void register_random_lowerings(std::map<OpKind, LowerFn>& t);   // lower_random.cc: RandomUniform/Normal, Bernoulli
// lower_train_mode.cc: BatchNormalization with batch statistics, Dropout in training mode; and
// BatchNormalization's inference form with statistics computed at run time.
// lower_norm.cc and lower_data.cc hand these over.
Status lower_batch_norm_train(Lowering& L, const Node& n);
Status lower_dropout_train(Lowering& L, const Node& n);
void register_fft_lowerings(std::map<OpKind, LowerFn>& t);  // lower_fft.cc: DFT, STFT (cuFFT)
// lower_integer.cc: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv (exact float products)
void register_integer_lowerings(std::map<OpKind, LowerFn>& t);
// A 2-D Conv whose weight or bias is computed at run time (lower_conv_fed.cc; lower_conv hands it
// over): cuDNN reads the filter from the arena.
Status lower_conv_fed(Lowering& L, const Node& n);
// A Conv of 3 spatial dims, or of 1 with a weight computed at run time (lower_conv_nd.cc): cuDNN's
// N-d descriptors, row-major.
Status lower_conv_nd(Lowering& L, const Node& n);
Status lower_conv_transpose_nd(Lowering& L, const Node& n);  // ConvTranspose of 1 or 3 spatial dims
// An f64 convolution (lower_conv_nd.cc) with n's Conv attributes (strides, dilations, pads symmetric
// per dim, group) of x [N, C, spatial...] by w [K, C/group, kernel...] into y, all f64 buffers of
// node n: the exact product of ConvInteger and QLinearConv (lower_integer.cc).
Status emit_conv_f64(Lowering& L, const Node& n, const DevValue* x, const DevValue* w, const DevValue& y);
// One generated kernel (codegen_elementwise.h) computing n's output from `body`, whose inputs are
// n's inputs in order; `strides`, where given for an input, replace its broadcast strides (a
// per-channel operand, say). lower_fused.cc.
Status lower_generated(Lowering& L, const Node& n, const Graph* body, const std::vector<std::vector<int64_t>>& strides = {});
// Whether n is a FusedElementwise whose body is SiLU of its one input: Sigmoid(a) then a * that
// (lower_norm.cc).
bool is_silu(const Node& n);
// A 2-D convolution with its epilogue, y = act(conv(x, w) + bias + z), as one cuDNN operation graph
// (lower_conv_graph.cc): NHWC fp16/bf16 tensors x [N, C, H, W], w [K, C, R, S] (stored KRSC), y and
// z [N, K, P, Q]; bias [K]. act: 0 none, 1 ReLU, 2 swish (SiLU).
struct GraphConv {
  k::DT dt = k::DT::kF16;
  std::array<int64_t, 4> x{}, w{}, y{};
  std::array<int64_t, 2> pre{}, post{}, stride{1, 1}, dil{1, 1};
  bool bias = false, residual = false;
  int act = 0;
  std::string key(size_t workspace) const;  // the timing cache's signature, with the workspace allowed
};
// A cuDNN engine for it ("<global index>:<knob>=<value>,...") and its time in a captured forward.
struct GraphConvChoice {
  std::string engine;
  float ms = -1;
};
// The fastest of the engines cuDNN's heuristics rank first, timed (or from the timing cache); none
// when no engine finalizes, or when nothing may be timed and the cache has no entry.
Expected<std::optional<GraphConvChoice>> pick_graph_conv(Lowering& L, const GraphConv& c);
// The step running it: x, w (KRSC), b and z (Ref{} when absent) into y.
void emit_graph_conv(Lowering& L, const Node& n, const GraphConv& c, const GraphConvChoice& ch, const std::string& impl,
                     Ref x, Ref w, Ref b, Ref z, Ref y, std::vector<int> reads);
void register_graph_conv_binder(std::map<StepOp, BindFn>& t);
// A device value's [K, C, R, S] filter copied as [K, R, S, C] into a buffer of node n (cuDNN's
// NHWC filter layout, for filters computed at run time).
const DevValue* filter_krsc_copy(Lowering& L, const Node& n, const DevValue* w);


// Convenience for lowering functions.
#define KILN_UNSUPPORTED(...) return KILN_ERROR(kUnsupported, __VA_ARGS__)

}  // namespace kiln::cuda
