// kiln: compile and run ONNX models. Subcommands (like trtexec, but split by job):
//   kiln inspect model.onnx [--ir] [--dot FILE]
//   kiln run model.onnx --input NAME=FILE.npy ... [--random-inputs --seed S] [--output-dir DIR]
//   kiln compare model.onnx --inputs DIR --reference DIR [--rtol R --atol A]
#include <CLI/CLI.hpp>
#include <exception>

#include "cli.h"

namespace {

void add_load_options(CLI::App* app, kiln::cli::LoadOptions& load) {
  app->add_option("model", load.model, "ONNX model file")->required();
  app->add_option("--shapes", load.shapes, "bind an input's shape, e.g. input:1x3x224x224 (repeatable)");
}

void add_input_options(CLI::App* app, kiln::cli::RunOptions& run) {
  app->add_option("--input", run.inputs, "NAME=FILE.npy, one per input (repeatable)");
  app->add_flag("--random-inputs", run.random_inputs, "fill inputs not given with seeded random data");
  app->add_option("--seed", run.seed, "seed for --random-inputs")->default_val(0);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln::cli;
  CLI::App app{"kiln: an ahead-of-time compiler and runtime for ONNX models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kiln 0.1.0");

  LoadOptions load;
  InspectOptions inspect;
  RunOptions run;
  CompareOptions compare;

  CLI::App* ins = app.add_subcommand("inspect", "print a model's inputs, outputs, opsets, op histogram and parameters");
  add_load_options(ins, load);
  ins->add_flag("--ir", inspect.ir, "print the imported graph as kiln IR text");
  ins->add_option("--dot", inspect.dot, "write the graph as Graphviz to FILE");

  CLI::App* r = app.add_subcommand("run", "run a model on .npy inputs and write one .npy per output");
  add_load_options(r, load);
  add_input_options(r, run);
  r->add_option("--output-dir", run.output_dir, "write OUTPUT.npy files here");
  r->add_option("--warmup", run.warmup, "untimed runs before timing")->default_val(0);
  r->add_option("--iterations", run.iterations, "timed runs (median and p99 are printed)")->default_val(1);
  r->add_option("--top-k", run.top_k, "print the K highest scores of each float output (classifiers)");
  r->add_option("--labels", run.labels, "class names, one per line, for --top-k");

  CLI::App* cmp = app.add_subcommand("compare", "run a model and check its outputs against reference .npy files");
  add_load_options(cmp, load);
  add_input_options(cmp, run);
  cmp->add_option("--inputs", compare.inputs_dir, "folder with INPUT.npy per model input")->required();
  cmp->add_option("--reference", compare.reference_dir, "folder with OUTPUT.npy per model output")->required();
  cmp->add_option("--rtol", compare.rtol, "relative tolerance")->default_val(1e-3);
  cmp->add_option("--atol", compare.atol, "absolute tolerance")->default_val(1e-4);

  CLI11_PARSE(app, argc, argv);
  try {
    if (ins->parsed()) return inspect_main(load, inspect);
    if (r->parsed()) return run_main(load, run);
    if (cmp->parsed()) return compare_main(load, run, compare);
  } catch (const std::bad_alloc&) {
    return fail(KILN_ERROR(kOutOfMemory, "out of host memory"));
  } catch (const std::exception& e) {
    return fail(KILN_ERROR(kInternal, "internal error: {}", e.what()));
  }
  return 1;
}
