// A device plan: what a GPU engine runs, as data. The backend's lowering emits one record per step:
// a kind (a number the backend defines: cuBLASLt matmul, cuDNN convolution, a kiln kernel, an NVRTC
// kernel by its cubin, a host step...), its plain parameters (dims, strides, every autotuned choice,
// encoded with ByteWriter), and references to device buffers (an activation-arena buffer or a
// weight). Beside the steps: the arena's buffer sizes and planned offsets, the weights as laid out
// for the device, and where the graph's inputs and outputs live. The backend's executor turns each
// record into descriptors and a launch (backends/cuda/executor.h) from this alone; a loaded engine
// runs no lowering, no pass and no timing.
//
//   DevicePlan p = ...;                                   // from a build
//   std::string dpln = write_device_plan(p);              // the engine file's DPLN section
//   std::string dwgt = write_device_weights(p.weights);   // its DWGT section
//   KILN_ASSIGN_OR_RETURN(DevicePlan q, read_device_plan(dpln, dwgt, "model.kiln"));
//
// Nothing here includes CUDA: records are bytes whose meaning belongs to the backend.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/bytes.h"
#include "support/status.h"

namespace kiln {

// A device buffer: arena buffer `id` (its offset is the memory plan's) or weight `id`; id < 0: none.
struct DeviceRef {
  bool weight = false;
  int32_t id = -1;
  bool operator==(const DeviceRef&) const = default;
};

struct DeviceStep {
  uint16_t kind = 0;          // the backend's step kind
  std::string label;          // "node 'fc1' (Gemm, #4): cublasLt fp16 m=... (algo ...)"
  std::string node;           // the node's describe(), empty for steps of no node (input casts)
  int32_t node_index = -1;    // host steps: the node's index in the plan graph's top-level nodes
  std::string params;         // ByteWriter encoding, read by the kind's binder
  std::vector<int32_t> reads, writes;  // arena buffer ids, for liveness
  int32_t bad_index_slot = -1;  // a device counter of out-of-range indices this step increments
  bool host = false;            // runs on the host between captured graphs
  bool triggers_dependents = false;  // lets the next kernel launch early (programmatic launch)
};

// Where a graph input or output lives on the device, in the dtype the device holds it.
struct DeviceIo {
  DeviceRef ref;
  uint8_t device_dtype = 0;  // the backend's element type
  int32_t ir_dtype = 0;      // DType of the graph value
  std::vector<int64_t> dims;
};

// One row of the build report: where a node went and why.
struct DevicePlacement {
  std::string node;
  uint8_t placement = 0;  // the backend's Placement
  std::string impl, why;
};

struct DevicePlan {
  std::vector<DeviceStep> steps;
  std::vector<uint64_t> buffer_bytes;  // per arena buffer id
  std::vector<uint64_t> offsets;       // per arena buffer id, from the memory plan
  // Per arena buffer id, the backend's element type of the value it holds (kNoDtype: scratch);
  // what check_finite reads.
  std::vector<uint8_t> buffer_dtype;
  static constexpr uint8_t kNoDtype = 255;
  uint64_t arena_peak = 0, arena_naive = 0, arena_lower_bound = 0;
  int32_t bad_index_slots = 0;
  std::vector<DeviceIo> inputs, outputs;  // graph-input / graph-output order
  // Per weight id, its bytes as the device holds them. A build owns them (weight_store); a loaded
  // plan views the engine file.
  std::vector<std::string_view> weights;
  std::vector<std::string> weight_store;
  // A plan whose weights live in a dynamic engine's pool (backends/cuda/weight_pool.h): the pool's
  // id per weight id, and `weights` is empty. Never written to a file.
  std::vector<int32_t> pooled;
  std::vector<DevicePlacement> placements;  // the build report's rows
  double build_ms = 0;

  // Points `weights` at `weight_store` (after a build filled the store).
  void view_store();
};

// Each weight's offset in DWGT is a multiple of this: the layout of the one device allocation that
// holds them, so the device's copy can be written out as it is.
inline constexpr size_t kDeviceWeightAlign = 256;

// The DPLN section (everything but the weights' bytes) and the DWGT section (each weight at a
// multiple of kDeviceWeightAlign, offsets in DPLN).
std::string write_device_plan(const DevicePlan& p);
std::string write_device_weights(const DevicePlan& p);
// Reads both sections; `dwgt` is viewed, not copied. Checks what can be checked without the
// backend: every reference in range, offsets inside the arena, weights inside DWGT. `name` (the
// file) starts every error.
Expected<DevicePlan> read_device_plan(std::string_view dpln, std::string_view dwgt, const std::string& name);

}  // namespace kiln
