// The engine file (.kiln): one plan on disk, versioned and checksummed.
//
//   bytes 0..7     magic "KILNENGN"
//   8..11          format version (u32, little-endian)      kEngineFormatVersion
//   12..15         0
//   16..23         file size in bytes (u64)
//   24..           sections, each: tag (4 ASCII bytes), 0 (u32), length (u64), data, zero padding to 64
//   last 8 bytes   checksum of every byte before it (u64, engine_checksum)
//
// Sections, in this order:
//   META  JSON: kiln and format versions, the device it was built for (GPU name, compute capability,
//         CUDA / cuBLASLt / cuDNN versions), the whole build configuration, input and output
//         metadata, the build report. Read first, so a mismatch is named before anything else.
//   GRPH  the optimized graph in kiln's IR text (docs/ir.md), constants over 16 elements elided (a
//         dynamic GPU engine's: the graph before the passes, which it optimizes per shape)
//   WTAB  the weight table: per elided constant its value name, dtype, dims, offset and size in WGHT
//         (none when META has "graph_weights": false — a GPU engine, whose DWGT holds the weights
//         as the device uses them; its graph's elided constants then have no data)
//   WGHT  the weights, each 64-byte aligned (string tensors as u32 length + bytes per element)
//   PLAN  the steps: slot count, input/output/constant refs, per step kind, node, refs, frees
//   (any section a backend adds after PLAN, e.g. its kernel choices, is carried through by tag)
//
// Every read is bounds-checked; a file that is not an engine, comes from another format version,
// is truncated, or has any byte changed is a one-line error naming the file and which it is.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "runtime/plan.h"

namespace kiln {

inline constexpr uint32_t kEngineFormatVersion = 1;

struct EngineFile {
  nlohmann::json meta;
  Plan plan;
  // Backend sections by tag (4 characters), viewing the bytes read_engine_file was given: valid
  // while they are.
  std::map<std::string, std::string_view> extra;
};

// The bytes of an engine file holding `plan` (whose graph is printed, not changed).
Expected<std::string> write_engine_file(const nlohmann::json& meta, const Plan& plan,
                                        const std::map<std::string, std::string>& extra = {});

// Reads an engine file from `bytes`; `name` (the path) starts every error message. The plan's
// weights view the bytes in place and keep `owner` (what holds them: a mapping of the file, a
// string) alive.
Expected<EngineFile> read_engine_file(std::string_view bytes, std::shared_ptr<const void> owner, const std::string& name);
Expected<EngineFile> read_engine_file(std::shared_ptr<const std::string> bytes, const std::string& name);

// A copy of g whose large constants share g's storage (what its text form would carry, copied
// structure by structure): the shape plans of a dynamic engine each bind and optimize a copy of
// one graph.
Expected<std::unique_ptr<Graph>> clone_graph(const Graph& g);

// Reads only what identifies the file: magic, format version, size, checksum and META (for
// `kiln inspect` and for checking that an engine can run here before reading the rest).
Expected<nlohmann::json> read_engine_meta(std::string_view bytes, const std::string& name);

// 64-bit checksum: the bytes in 4 MiB chunks, each hashed by four interleaved multiply-rotate lanes
// over 8-byte words (chunks in parallel), the chunk hashes folded in order. Any change of one word
// always changes the result (each step is a bijection of the state given the word).
uint64_t engine_checksum(const void* data, size_t size);

// Whether these bytes start like an engine file (the CLI tells .kiln from .onnx by content).
bool looks_like_engine_file(const std::string& first_bytes);

}  // namespace kiln
