// Helpers of the fast CPU backend's tests (fast_cpu_test.cc, fast_cpu_steps_test.cc): a graph in
// IR text planned both ways (oneDNN and the reference kernels) and run on the same random inputs,
// the outputs compared, the plan's primitives counted.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "api/engine_impl.h"
#include "backends/cpu/fast_fused.h"
#include "backends/cpu/fast_session.h"
#include "ir/text.h"

namespace kiln::fast_cpu_test {

inline std::unique_ptr<Graph> parse(const std::string& text) {
  auto g = parse_graph(text);
  EXPECT_TRUE(g) << g.status().message() << "\n" << text;
  return g ? std::move(*g) : nullptr;
}

// Every constant of more than one element gets random values (the text form splats one).
inline void randomize_constants(Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const auto& v : g.values) {
    // A constant named keep... (a Resize's scales) stays as written.
    if (v->constant && v->constant->dtype() == DType::kFloat32 && v->constant->numel() > 1 && v->name.rfind("keep", 0) != 0) {
      Tensor t = Tensor::create(DType::kFloat32, v->constant->dims()).value();
      // A variance (a constant named var...) stays positive.
      const bool positive = v->name.rfind("var", 0) == 0;
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = positive ? 0.1f + std::fabs(u(rng)) : u(rng);
      v->constant = std::move(t);
    }
  }
}

inline std::vector<Data> random_inputs(const Graph& g, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<Data> in;
  for (const Value* v : g.inputs) {
    if (v->type.dtype == DType::kBool) {  // a condition: take the branch that reads the outer value
      in.emplace_back(Tensor::scalar<bool>(false));
      continue;
    }
    Tensor t = Tensor::create(DType::kFloat32, *v->type.shape->static_dims()).value();
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    in.emplace_back(std::move(t));
  }
  return in;
}

struct Result {
  CpuPlan cp;
  std::vector<Data> fast, ref;
};

// `text` parsed, its constants randomized, `sets` input sets drawn, then planned for the host and
// for oneDNN; nullopt (the failure reported) when any of it fails.
struct Planned {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<const CpuPlan> cp;
  std::vector<std::vector<Data>> inputs;
};
inline std::optional<Planned> plan_both(const std::string& text, uint32_t seed, int sets = 1) {
  std::mt19937 rng(seed);
  auto g = parse(text);
  if (!g) return std::nullopt;
  randomize_constants(*g, rng);
  Planned r;
  for (int i = 0; i < sets; ++i) r.inputs.push_back(random_inputs(*g, rng));
  auto plan = plan_host(std::move(g));
  EXPECT_TRUE(plan) << plan.status().message();
  if (!plan) return std::nullopt;
  r.plan = std::make_shared<const Plan>(std::move(*plan));
  auto cp = plan_fast_cpu(*r.plan);
  EXPECT_TRUE(cp) << cp.status().message();
  if (!cp) return std::nullopt;
  r.cp = std::make_shared<const CpuPlan>(std::move(*cp));
  return r;
}

// Plans `text` both ways and runs both on the same random inputs.
inline Result run_both(const std::string& text, uint32_t seed) {
  Result r;
  std::optional<Planned> pl = plan_both(text, seed);
  if (!pl) return r;
  const std::vector<Data>& in = pl->inputs[0];
  const std::shared_ptr<const Plan>& p = pl->plan;
  r.cp = *pl->cp;
  auto runner = CpuRunner::create(p, pl->cp);
  EXPECT_TRUE(runner) << runner.status().message() << "\n" << text;
  if (!runner) return r;
  auto fast = (*runner)->run(in);
  EXPECT_TRUE(fast) << fast.status().message();
  auto ref = run_plan(*p, in);
  EXPECT_TRUE(ref) << ref.status().message();
  if (fast && ref) {
    r.fast = std::move(*fast);
    r.ref = std::move(*ref);
  }
  return r;
}

// |fast - ref| <= atol + rtol * |ref| everywhere, and the same NaN/Inf.
inline void expect_close(const Result& r, const std::string& what, float atol = 1e-4f, float rtol = 1e-4f) {
  ASSERT_EQ(r.fast.size(), r.ref.size()) << what;
  ASSERT_FALSE(r.ref.empty()) << what;
  for (size_t i = 0; i < r.ref.size(); ++i) {
    const Tensor& a = r.fast[i].tensor;
    const Tensor& b = r.ref[i].tensor;
    ASSERT_EQ(a.summary(), b.summary()) << what;
    int bad = 0;
    for (int64_t k = 0; k < a.numel() && bad < 5; ++k) {
      const float x = a.data<float>()[k], y = b.data<float>()[k];
      if (!(std::fabs(x - y) <= atol + rtol * std::fabs(y))) {
        ADD_FAILURE() << what << ": output " << i << " element " << k << ": fast " << x << ", reference " << y;
        ++bad;
      }
    }
  }
}

inline size_t primitives(const CpuPlan& cp, CpuStepKind k) {
  size_t n = 0;
  for (const CpuStep& s : cp.steps) n += s.kind == k;
  return n;
}

inline bool have_onednn() {
  std::string why;
  if (fast_cpu_available(&why)) return true;
  ADD_FAILURE() << "the fast CPU backend needs oneDNN (scripts/install-deps.sh): " << why;
  return false;
}

}  // namespace kiln::fast_cpu_test
