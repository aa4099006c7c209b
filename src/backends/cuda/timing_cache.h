// Autotuning results that outlive a build (TensorRT's timing cache): each timed choice (a cuBLASLt
// algorithm, a Hopper GEMM tile, a cuDNN convolution algorithm) is stored under the GPU and library
// versions it was timed with and the op's signature (shapes, dtypes, layout, epilogue). A build
// asks the cache before timing and adds what it timed; a later build of any model with the same
// signatures times nothing. The entries one engine used travel in its engine file, so loading
// the engine times nothing either.
//
//   auto cache = std::make_shared<TimingCache>(target_id(current_target()));
//   KILN_RETURN_IF_ERROR(cache->merge_file("~/.cache/kiln/timing.cache"));   // absent: empty
//   opt.timing_cache = cache;  ... Engine::build(g, opt) ...
//   KILN_RETURN_IF_ERROR(cache->save_file(path));
//
// Signatures are `FORM @ DIMS`: what must match exactly, then the shapes (nearest()).
// The file is text, one entry per line: `<target>|<kind>|<signature>\t<value>`; entries of other
// targets are kept when the file is rewritten. Values are written and read by the lowering that
// owns the kind (lower_gemm.cc "lt", lower_gemm_sm90.cc "sm90", lower_conv.cc "conv").
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "backends/cuda/target.h"
#include "support/status.h"

namespace kiln::cuda {

// A short stable name for a target (GPU, compute capability, CUDA / cuBLASLt / cuDNN versions).
std::string target_id(const TargetInfo& t);

class TimingCache {
 public:
  explicit TimingCache(std::string target) : target_(std::move(target)) {}

  // The value stored for (kind, signature) on this target; marks the entry as used.
  std::optional<std::string> get(const std::string& kind, const std::string& signature);
  void put(const std::string& kind, const std::string& signature, std::string value);
  // For a signature written `FORM @ DIMS` (DIMS: numbers, with any letters between them), the value
  // of the entry of the same kind and FORM whose DIMS are nearest (the least sum of |log(a/b)|), for
  // a shape nothing was timed at: a dynamic engine's shape plan takes the choice of the nearest shape
  // its build timed. The lowering still checks that the library accepts it.
  std::optional<std::string> nearest(const std::string& kind, const std::string& signature);

  // Entries in the text form. `only_used`: the entries looked up or added since construction (what
  // one engine needs, for its file).
  std::string to_text(bool only_used = false) const;
  // Adds the entries of a text form; a malformed line is an error naming its number.
  Status merge_text(const std::string& text, const std::string& name);
  // merge_text of a file; a missing file is an empty cache, not an error.
  Status merge_file(const std::string& path);
  // Writes every entry (this target's and others') atomically: a temporary file renamed.
  Status save_file(const std::string& path) const;

  size_t size() const;
  int hits() const { return hits_; }
  int misses() const { return misses_; }

 private:
  std::string target_;
  mutable std::mutex mu_;
  std::map<std::string, std::string> entries_;  // full key -> value
  std::set<std::string> used_;
  int hits_ = 0, misses_ = 0;
};

}  // namespace kiln::cuda
