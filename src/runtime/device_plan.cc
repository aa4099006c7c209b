// Writing and reading device plans (the layout is in device_plan.h).
#include "runtime/device_plan.h"

#include <algorithm>

namespace kiln {

namespace {

constexpr size_t kWeightAlign = kDeviceWeightAlign;
constexpr uint32_t kDevicePlanVersion = 2;  // 2: buffer dtypes

void put_ref(ByteWriter& w, const DeviceRef& r) {
  w.u8(r.weight);
  w.put(r.id);
}

DeviceRef get_ref(ByteReader& r) {
  DeviceRef d;
  d.weight = r.get_in<uint8_t>("a buffer reference", 0, 1) != 0;
  d.id = r.get<int32_t>("a buffer reference");
  return d;
}

void put_io(ByteWriter& w, const std::vector<DeviceIo>& v) {
  w.u32(uint32_t(v.size()));
  for (const DeviceIo& io : v) {
    put_ref(w, io.ref);
    w.u8(io.device_dtype);
    w.put(io.ir_dtype);
    w.vec(io.dims);
  }
}

std::vector<DeviceIo> get_io(ByteReader& r) {
  std::vector<DeviceIo> v(r.count("an input/output list", 5 + 1 + 4 + 4));
  for (DeviceIo& io : v) {
    io.ref = get_ref(r);
    io.device_dtype = r.get<uint8_t>("an input/output dtype");
    io.ir_dtype = r.get<int32_t>("an input/output dtype");
    io.dims = r.vec<int64_t>("input/output dims");
    for (int64_t d : io.dims) {
      if (d < 0) r.fail("input/output dims", "negative");
    }
  }
  return v;
}

}  // namespace

void DevicePlan::view_store() {
  weights.assign(weight_store.begin(), weight_store.end());
}

std::string write_device_plan(const DevicePlan& p) {
  ByteWriter w;
  w.u32(kDevicePlanVersion);
  w.vec(p.buffer_bytes);
  w.vec(p.offsets);
  w.vec(p.buffer_dtype);
  w.u64(p.arena_peak);
  w.u64(p.arena_naive);
  w.u64(p.arena_lower_bound);
  w.put(p.bad_index_slots);
  put_io(w, p.inputs);
  put_io(w, p.outputs);
  // The weight table: offset and size of each in DWGT.
  w.u32(uint32_t(p.weights.size()));
  uint64_t at = 0;
  for (std::string_view b : p.weights) {
    at = (at + kWeightAlign - 1) / kWeightAlign * kWeightAlign;
    w.u64(at);
    w.u64(b.size());
    at += b.size();
  }
  w.u32(uint32_t(p.steps.size()));
  for (const DeviceStep& s : p.steps) {
    w.put(s.kind);
    w.str(s.label);
    w.str(s.node);
    w.put(s.node_index);
    w.str(s.params);
    w.vec(s.reads);
    w.vec(s.writes);
    w.put(s.bad_index_slot);
    w.u8(uint8_t(s.host) | uint8_t(s.triggers_dependents) << 1);
  }
  w.u32(uint32_t(p.placements.size()));
  for (const DevicePlacement& d : p.placements) {
    w.str(d.node);
    w.u8(d.placement);
    w.str(d.impl);
    w.str(d.why);
  }
  w.put(p.build_ms);
  return std::move(w.bytes());
}

std::string write_device_weights(const DevicePlan& p) {
  ByteWriter w;
  for (std::string_view b : p.weights) {
    w.pad(kWeightAlign);
    w.raw(b.data(), b.size());
  }
  return std::move(w.bytes());
}

Expected<DevicePlan> read_device_plan(std::string_view dpln, std::string_view dwgt, const std::string& name) {
  auto err = [&](const std::string& what) { return KILN_ERROR(kInvalidModel, "{}: {}", name, what); };
  ByteReader r(dpln, "DPLN section");
  DevicePlan p;
  uint32_t version = r.get<uint32_t>("the device plan version");
  if (r.ok() && version != kDevicePlanVersion) {
    return err(fmt::format("device plan version {}, this kiln reads version {}", version, kDevicePlanVersion));
  }
  p.buffer_bytes = r.vec<uint64_t>("the buffer sizes");
  p.offsets = r.vec<uint64_t>("the arena offsets");
  p.buffer_dtype = r.vec<uint8_t>("the buffer dtypes");
  p.arena_peak = r.get<uint64_t>("the arena size");
  p.arena_naive = r.get<uint64_t>("the arena size");
  p.arena_lower_bound = r.get<uint64_t>("the arena size");
  p.bad_index_slots = r.get_in<int32_t>("the index-check count", 0, 1 << 20);
  p.inputs = get_io(r);
  p.outputs = get_io(r);
  uint32_t nw = r.count("the weight count", 16);
  for (uint32_t i = 0; i < nw && r.ok(); ++i) {
    uint64_t off = r.get<uint64_t>("a weight offset"), len = r.get<uint64_t>("a weight size");
    if (r.ok() && (off > dwgt.size() || len > dwgt.size() - off)) return err(fmt::format("weight {} lies outside DWGT", i));
    p.weights.push_back(dwgt.substr(off, len));
  }
  uint32_t ns = r.count("the step count", 2 + 4 + 4 + 4 + 4 + 4 + 4 + 4 + 1);
  p.steps.resize(ns);
  for (DeviceStep& s : p.steps) {
    s.kind = r.get<uint16_t>("a step kind");
    s.label = r.str("a step label");
    s.node = r.str("a step's node");
    s.node_index = r.get<int32_t>("a step's node");
    s.params = r.str("a step's parameters");
    s.reads = r.vec<int32_t>("a step's reads");
    s.writes = r.vec<int32_t>("a step's writes");
    s.bad_index_slot = r.get<int32_t>("a step's index check");
    uint8_t flags = r.get_in<uint8_t>("a step's flags", 0, 3);
    s.host = flags & 1;
    s.triggers_dependents = flags & 2;
  }
  p.placements.resize(r.count("the placement count", 4 + 1 + 4 + 4));
  for (DevicePlacement& d : p.placements) {
    d.node = r.str("a placement");
    d.placement = r.get<uint8_t>("a placement");
    d.impl = r.str("a placement");
    d.why = r.str("a placement");
  }
  p.build_ms = r.get<double>("the build time");
  if (!r.ok()) return err(r.failed());
  if (r.left() != 0) return err("DPLN section has bytes after its end");

  // References in range and the memory plan inside the arena, so no binder indexes out of bounds.
  const size_t nb = p.buffer_bytes.size();
  if (p.offsets.size() != nb) return err("DPLN section: the memory plan does not cover every buffer");
  if (p.buffer_dtype.size() != nb) return err("DPLN section: the buffer dtypes do not cover every buffer");
  for (size_t b = 0; b < nb; ++b) {
    if (p.offsets[b] > p.arena_peak || p.buffer_bytes[b] > p.arena_peak - p.offsets[b]) {
      // A buffer no step touches is planned at 0 bytes wherever; one that is used must fit.
      if (p.buffer_bytes[b] != 0) return err(fmt::format("DPLN section: buffer {} lies outside the arena", b));
    }
  }
  auto ref_ok = [&](const DeviceRef& d) {
    return d.id >= 0 && (d.weight ? size_t(d.id) < p.weights.size() : size_t(d.id) < nb);
  };
  for (const auto* io : {&p.inputs, &p.outputs}) {
    for (const DeviceIo& d : *io) {
      if (!ref_ok(d.ref)) return err("DPLN section: an input or output refers to no buffer");
    }
  }
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const DeviceStep& s = p.steps[i];
    auto bad = [&](int32_t b) { return b < 0 || size_t(b) >= nb; };
    if (std::any_of(s.reads.begin(), s.reads.end(), bad) || std::any_of(s.writes.begin(), s.writes.end(), bad) ||
        s.bad_index_slot < -1 || s.bad_index_slot >= p.bad_index_slots) {
      return err(fmt::format("DPLN section: step {} ({}) refers to a buffer outside the plan", i, s.label));
    }
  }
  return p;
}

}  // namespace kiln
