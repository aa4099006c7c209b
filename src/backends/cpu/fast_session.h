// Runs a fast CPU plan (fast_plan.h): its primitive steps through oneDNN, its host steps on the
// reference kernels, as run_plan does. Creating a runner makes every primitive once for the plan's
// static shapes and reorders each weight into the layout its primitive chose; a run only binds
// buffers and executes. Both happen on the process's compute thread (compute_thread.h), whichever
// thread calls.
//
//   KILN_ASSIGN_OR_RETURN(auto r, CpuRunner::create(plan, cpu_plan));
//   KILN_ASSIGN_OR_RETURN(std::vector<Data> out, r->run(inputs));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/fast_plan.h"

namespace kiln {

class CpuRunner {
 public:
  // kUnsupported when oneDNN cannot be loaded (the message says why) or has no implementation for
  // a step (naming its node).
  static Expected<std::unique_ptr<CpuRunner>> create(std::shared_ptr<const Plan> plan, std::shared_ptr<const CpuPlan> cp);
  ~CpuRunner();

  // Inputs in graph-input order (checked against the graph); outputs in graph-output order. With
  // step_ms, each step's wall time is stored there.
  Expected<std::vector<Data>> run(std::vector<Data> inputs, std::vector<double>* step_ms = nullptr);

  // Per step: what runs it ("oneDNN brg:avx2", "reference kernel").
  const std::vector<std::string>& impls() const;
  size_t weight_bytes() const;  // the reordered weights this runner holds
  size_t arena_bytes() const;   // the arena its steps' intermediate results share

  struct Impl;

 private:
  explicit CpuRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where oneDNN comes from ("oneDNN 3.2.0 (PATH)"), or null with *why.
bool fast_cpu_available(std::string* what);

}  // namespace kiln
