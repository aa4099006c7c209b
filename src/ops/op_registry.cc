#include "ops/op_registry.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace kiln {

#define KILN_FAMILY(f) void register_##f##_ops(OpRegistry& r);
#include "ops/families.def"
#undef KILN_FAMILY

namespace {

struct OpInfo {
  std::string_view name, domain;
  int opset;
};
constexpr OpInfo kOpInfo[] = {
#define KILN_OP(name, domain, opset) {#name, domain, opset},
#include "ops/ops.def"
#undef KILN_OP
};

}  // namespace

std::string_view op_name(OpKind op) { return kOpInfo[size_t(op)].name; }
std::string_view op_domain(OpKind op) { return kOpInfo[size_t(op)].domain; }
int op_canonical_opset(OpKind op) { return kOpInfo[size_t(op)].opset; }

std::optional<OpKind> op_from_name(std::string_view domain, std::string_view name) {
  if (domain == "ai.onnx") domain = "";
  for (int i = 0; i < kNumOps; ++i) {
    if (kOpInfo[i].name == name && kOpInfo[i].domain == domain) return OpKind(i);
  }
  return std::nullopt;
}

const OpRegistry& op_registry() {
  static const OpRegistry reg = [] {
    OpRegistry r;
#define KILN_FAMILY(f) register_##f##_ops(r);
#include "ops/families.def"
#undef KILN_FAMILY
    return r;
  }();
  return reg;
}

const Type& InferCtx::input_type(size_t i) const {
  static const Type kUnknown;
  return has_input(i) ? node_.inputs[i]->type : kUnknown;
}

const Tensor* InferCtx::input_constant(size_t i) const {
  if (!has_input(i) || !node_.inputs[i]->constant) return nullptr;
  return &*node_.inputs[i]->constant;
}

const std::vector<Dim>* InferCtx::input_dims_value(size_t i) const {
  if (!has_input(i)) return nullptr;
  const Value* v = node_.inputs[i];
  return v->dims_value ? &*v->dims_value : nullptr;
}

std::optional<std::vector<Dim>> InferCtx::input_as_dims(size_t i) const {
  if (const Tensor* t = input_constant(i); t && t->dtype() != DType::kString && t->rank() <= 1) {
    std::vector<Dim> d;
    for (int64_t k = 0; k < t->numel(); ++k) d.emplace_back(t->as_int(k));
    return d;
  }
  if (const std::vector<Dim>* d = input_dims_value(i)) return *d;
  return std::nullopt;
}

void InferCtx::set_output(size_t i, Type t) {
  if (has_output(i)) node_.outputs[i]->type = std::move(t);
}

void InferCtx::set_output_dims_value(size_t i, std::vector<Dim> v) {
  if (has_output(i)) node_.outputs[i]->dims_value = std::move(v);
}

const Type& InferCtx::output_type(size_t i) const {
  static const Type kUnknown;
  return has_output(i) ? node_.outputs[i]->type : kUnknown;
}

Expected<DType> InferCtx::tensor_dtype(size_t i) const {
  if (!has_input(i)) return error("input {} is required", i);
  const Type& t = input_type(i);
  if (!t.is_tensor()) return error("input {} must be a tensor, got {}", i, t.to_string());
  return t.dtype;
}

const Data& KernelCtx::input(size_t i) const {
  static const Data kNone;
  return has_input(i) ? *inputs_[i] : kNone;
}

Expected<Tensor*> KernelCtx::alloc_output(size_t i, DType dt, std::vector<int64_t> dims) {
  auto t = Tensor::create(dt, std::move(dims));
  if (!t) return t.status().with_context(node_.describe() + ": output " + std::to_string(i));
  outputs_[i] = Data(std::move(*t));
  return &outputs_[i].tensor;
}

// A small fixed pool: kernels split work with parallel_for; nested calls run inline.
namespace {
class Pool {
 public:
  Pool() {
    unsigned n = std::max(1u, std::min(std::thread::hardware_concurrency(), 16u));
    for (unsigned i = 1; i < n; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    { std::lock_guard<std::mutex> l(mu_); stop_ = true; }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t size() const { return workers_.size() + 1; }
  void run(int64_t chunks, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> l(run_mu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> g(mu_);
      fn_ = &fn; next_ = 0; total_ = chunks; done_ = 0; ++gen_;
    }
    cv_.notify_all();
    in_pool_ = true;
    work();
    in_pool_ = false;
    std::unique_lock<std::mutex> g(mu_);
    done_cv_.wait(g, [&] { return done_ == total_; });
    fn_ = nullptr;
  }

 private:
  void work() {
    for (;;) {
      int64_t c;
      const std::function<void(int64_t)>* f;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (!fn_ || next_ >= total_) return;
        c = next_++;
        f = fn_;
      }
      (*f)(c);
      std::lock_guard<std::mutex> g(mu_);
      if (++done_ == total_) done_cv_.notify_all();
    }
  }
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(mu_);
        cv_.wait(g, [&] { return stop_ || gen_ != seen; });
        if (stop_) return;
        seen = gen_;
      }
      in_pool_ = true;
      work();
      in_pool_ = false;
    }
  }
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t next_ = 0, total_ = 0, done_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;

 public:
  static thread_local bool in_pool_;
};
thread_local bool Pool::in_pool_ = false;
}  // namespace

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  static Pool pool;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(pool.size()) * 4);
  if (chunks <= 1 || pool.size() == 1 || Pool::in_pool_) { fn(0, n); return; }
  int64_t step = (n + chunks - 1) / chunks;
  pool.run(chunks, [&](int64_t c) {
    int64_t b = c * step, e = std::min(n, b + step);
    if (b < e) fn(b, e);
  });
}

}  // namespace kiln
