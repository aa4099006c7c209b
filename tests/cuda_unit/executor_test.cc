// Binding step records (backends/cuda/executor.h) without a GPU: a well-formed record binds, and a
// malformed one — truncated, with bytes left over, a buffer outside the plan, an enum out of range,
// an unknown kind — is an error naming the step, never a closure that would read out of bounds.
#include <gtest/gtest.h>

#include "backends/cuda/executor.h"

namespace kiln::cuda {
namespace {

// A plan of one cast step from buffer 0 to buffer 1 with the given parameters.
DevicePlan cast_plan(const std::string& params, uint16_t kind = uint16_t(StepOp::kCast)) {
  DevicePlan p;
  p.buffer_bytes = {64, 64};
  p.offsets = {0, 64};
  p.buffer_dtype = {0, 0};
  p.arena_peak = 128;
  DeviceStep s;
  s.kind = kind;
  s.label = "node 'c' (Cast, #0): kernel cast";
  s.params = params;
  p.steps.push_back(s);
  return p;
}

std::string cast_params(int32_t from, int32_t to, Ref x, Ref y, int64_t n) {
  ByteWriter w;
  w.put(from);
  w.put(to);
  put(w, x);
  put(w, y);
  w.i64(n);
  return std::move(w.bytes());
}

Expected<std::vector<StepFn>> bind(const DevicePlan& p) {
  BuildOptions opt;
  std::vector<std::shared_ptr<void>> keep;
  BindCtx ctx{p, nullptr, opt, nullptr, nullptr, keep};
  return bind_plan(ctx);
}

TEST(Executor, WellFormedRecordBinds) {
  auto fns = bind(cast_plan(cast_params(int32_t(k::DT::kF32), int32_t(k::DT::kF16), Ref{false, 0}, Ref{false, 1}, 16)));
  ASSERT_TRUE(fns) << fns.status().message();
  EXPECT_EQ(fns->size(), 1u);
}

TEST(Executor, MalformedRecordsAreErrors) {
  const std::string good = cast_params(0, 1, Ref{false, 0}, Ref{false, 1}, 16);
  auto fails = [](const DevicePlan& p, const std::string& says) {
    auto fns = bind(p);
    ASSERT_FALSE(fns);
    EXPECT_EQ(fns.status().code(), ErrorCode::kInvalidModel);
    EXPECT_NE(fns.status().message().find("node 'c' (Cast, #0)"), std::string::npos) << fns.status().message();
    EXPECT_NE(fns.status().message().find(says), std::string::npos) << fns.status().message();
  };
  for (size_t n = 0; n < good.size(); ++n) fails(cast_plan(good.substr(0, n)), "ends inside");
  fails(cast_plan(good + "x"), "unread parameter bytes");
  fails(cast_plan(cast_params(0, 1, Ref{false, 2}, Ref{false, 1}, 16)), "outside the plan");
  fails(cast_plan(cast_params(0, 1, Ref{true, 0}, Ref{false, 1}, 16)), "outside the plan");  // no weights
  fails(cast_plan(cast_params(0, 1, Ref{false, -1}, Ref{false, 1}, 16)), "missing");
  fails(cast_plan(cast_params(0, 99, Ref{false, 0}, Ref{false, 1}, 16)), "out of range");
  fails(cast_plan(good, 999), "kind 999");
}

}  // namespace
}  // namespace kiln::cuda
