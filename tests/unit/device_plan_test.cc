// Device plans (src/runtime/device_plan.h): written and read back field for field; damage and
// references outside the plan are errors that say which.
#include <gtest/gtest.h>

#include "runtime/device_plan.h"

namespace kiln {
namespace {

DevicePlan sample() {
  DevicePlan p;
  p.buffer_bytes = {256, 512, 0};
  p.offsets = {0, 256, 0};
  p.buffer_dtype = {1, 0, DevicePlan::kNoDtype};
  p.arena_peak = 768;
  p.arena_naive = 768;
  p.arena_lower_bound = 512;
  p.bad_index_slots = 1;
  p.inputs.push_back(DeviceIo{DeviceRef{false, 0}, 1, 0, {2, 64}});
  p.outputs.push_back(DeviceIo{DeviceRef{false, 1}, 0, 0, {2, 64}});
  p.weight_store = {std::string(100, 'a'), std::string(3, 'b'), std::string()};
  p.view_store();
  DeviceStep s;
  s.kind = 7;
  s.label = "node 'g' (Gather, #1): kernel gather";
  s.node = "node 'g' (Gather, #1)";
  s.node_index = 1;
  s.params = std::string("\x01\x02\x00\x03", 4);
  s.reads = {0};
  s.writes = {1};
  s.bad_index_slot = 0;
  s.triggers_dependents = true;
  p.steps.push_back(s);
  DeviceStep h = s;
  h.kind = 1;
  h.host = true;
  h.triggers_dependents = false;
  h.bad_index_slot = -1;
  p.steps.push_back(h);
  p.placements.push_back({"node 'g' (Gather, #1)", 0, "kernel gather", ""});
  p.build_ms = 12.5;
  return p;
}

TEST(DevicePlan, RoundTrip) {
  DevicePlan p = sample();
  const std::string dpln = write_device_plan(p), dwgt = write_device_weights(p);
  auto q = read_device_plan(dpln, dwgt, "m.kiln");
  ASSERT_TRUE(q) << q.status().message();
  EXPECT_EQ(q->buffer_bytes, p.buffer_bytes);
  EXPECT_EQ(q->buffer_dtype, p.buffer_dtype);
  EXPECT_EQ(q->offsets, p.offsets);
  EXPECT_EQ(q->arena_lower_bound, 512u);
  ASSERT_EQ(q->weights.size(), 3u);
  EXPECT_EQ(q->weights[0], std::string(100, 'a'));
  EXPECT_EQ(q->weights[1], "bbb");
  EXPECT_TRUE(q->weights[2].empty());
  // Weights are viewed in DWGT, 64-byte aligned from its start.
  EXPECT_EQ((q->weights[1].data() - dwgt.data()) % 64, 0);
  ASSERT_EQ(q->steps.size(), 2u);
  EXPECT_EQ(q->steps[0].params, p.steps[0].params);
  EXPECT_EQ(q->steps[0].label, p.steps[0].label);
  EXPECT_EQ(q->steps[0].node_index, 1);
  EXPECT_TRUE(q->steps[0].triggers_dependents);
  EXPECT_FALSE(q->steps[0].host);
  EXPECT_TRUE(q->steps[1].host);
  EXPECT_EQ(q->inputs[0].dims, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(q->inputs[0].device_dtype, 1);
  EXPECT_EQ(q->placements[0].impl, "kernel gather");
  EXPECT_EQ(q->build_ms, 12.5);
  // Written again, byte for byte the same.
  EXPECT_EQ(write_device_plan(*q), dpln);
}

TEST(DevicePlan, EveryTruncationIsAnError) {
  DevicePlan p = sample();
  const std::string dpln = write_device_plan(p), dwgt = write_device_weights(p);
  for (size_t n = 0; n < dpln.size(); ++n) {
    auto q = read_device_plan(std::string_view(dpln).substr(0, n), dwgt, "m.kiln");
    ASSERT_FALSE(q) << "truncated to " << n;
    EXPECT_EQ(q.status().message().rfind("m.kiln: ", 0), 0u) << q.status().message();
  }
  auto extra = read_device_plan(dpln + "x", dwgt, "m.kiln");
  ASSERT_FALSE(extra);
  EXPECT_NE(extra.status().message().find("bytes after its end"), std::string::npos);
}

TEST(DevicePlan, ReferencesOutsideThePlan) {
  auto fails = [](DevicePlan p, const std::string& says) {
    p.view_store();
    auto q = read_device_plan(write_device_plan(p), write_device_weights(p), "m.kiln");
    ASSERT_FALSE(q);
    EXPECT_NE(q.status().message().find(says), std::string::npos) << q.status().message();
  };
  DevicePlan p = sample();
  p.steps[0].reads = {3};
  fails(p, "refers to a buffer outside the plan");
  p = sample();
  p.steps[0].bad_index_slot = 1;
  fails(p, "refers to a buffer outside the plan");
  p = sample();
  p.outputs[0].ref = DeviceRef{true, 5};
  fails(p, "refers to no buffer");
  p = sample();
  p.offsets[1] = 600;
  fails(p, "buffer 1 lies outside the arena");
  p = sample();
  p.offsets.pop_back();
  fails(p, "does not cover every buffer");
  // Weights outside DWGT: a table from a larger plan against a smaller DWGT.
  p = sample();
  auto q = read_device_plan(write_device_plan(p), std::string(10, '\0'), "m.kiln");
  ASSERT_FALSE(q);
  EXPECT_NE(q.status().message().find("lies outside DWGT"), std::string::npos);
}

TEST(DevicePlan, OtherVersion) {
  std::string dpln = write_device_plan(sample());
  dpln[0] = 9;
  auto q = read_device_plan(dpln, write_device_weights(sample()), "m.kiln");
  ASSERT_FALSE(q);
  EXPECT_NE(q.status().message().find("device plan version 9"), std::string::npos) << q.status().message();
}

}  // namespace
}  // namespace kiln
