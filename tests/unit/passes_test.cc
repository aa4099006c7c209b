// Pass goldens (DESIGN.md rule 10): every tests/passes/<pass-name>.kir file holds cases for the
// pass of that name in the default pipeline. The format, line-based:
//
//   # a comment (lines starting with '#' outside a case's IR; inside, '#' is an IR comment)
//   === a title for the case
//   graph main(...) { ... }          <- the input, in the text IR (docs/ir.md)
//   --- expect
//   graph main(...) { ... }          <- exactly what print_graph gives after the pass
//
// or, for a case the pass must leave alone, `--- unchanged` and nothing after it. Each case
// checks: the pass's changed flag (true for `expect` cases, false for `unchanged`); the printed IR,
// exactly; the verifier on the result; and the numerics: the input and output graphs run on the
// CPU backend on the same random inputs (symbolic dims bound to 3) give the same outputs, within
// 1e-4 relative for f32/f64 (two format steps, relative and of the largest output, for f16/bf16)
// and exactly for other dtypes.
//
// The pass manager is tested below the goldens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "backends/backend.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "ops/collective.h"
#include "passes/pipeline.h"
#include "passes/tensor_parallel.h"

#ifndef KILN_PASS_TESTS_DIR
#error "KILN_PASS_TESTS_DIR must name tests/passes (set in tests/CMakeLists.txt)"
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct Case {
  std::string pass, file, title, input, expect;
  bool unchanged = false;
  int line = 0;
};

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.file << ":" << c.line; }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n"), e = s.find_last_not_of(" \t\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<Case> read_cases(const fs::path& path) {
  std::vector<Case> cases;
  std::ifstream f(path);
  std::string line;
  std::string* into = nullptr;
  for (int n = 1; std::getline(f, line); ++n) {
    if (line.rfind("===", 0) == 0) {
      cases.push_back({path.stem().string(), path.filename().string(), trim(line.substr(3)), "", "", false, n});
      into = &cases.back().input;
    } else if (line.rfind("--- expect", 0) == 0 && !cases.empty()) {
      into = &cases.back().expect;
    } else if (line.rfind("--- unchanged", 0) == 0 && !cases.empty()) {
      cases.back().unchanged = true;
      into = nullptr;
    } else if (into) {
      *into += line + "\n";
    }
  }
  return cases;
}

std::vector<Case> all_cases() {
  std::vector<Case> all;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(KILN_PASS_TESTS_DIR)) {
    if (e.path().extension() == ".kir") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    for (Case& c : read_cases(p)) all.push_back(std::move(c));
  }
  return all;
}

const Pass* find_pass(const std::vector<Pass>& passes, const std::string& name) {
  for (const Pass& p : passes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

// ---- numerics -------------------------------------------------------------------------------

// Integers are drawn from [0, int_range): small, as shapes and indices must be.
Expected<std::vector<Data>> random_inputs(const Graph& g, uint64_t seed, uint64_t int_range = 3) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<Data> out;
  for (const Value* v : g.inputs) {
    if (v->constant) { out.emplace_back(*v->constant); continue; }
    if (!v->type.has_rank()) return KILN_ERROR(kInvalidArgument, "input '{}' has no rank", v->name);
    std::vector<int64_t> dims;
    for (const Dim& d : v->type.shape->dims) dims.push_back(d.is_static() ? d.value() : 3);
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::create(v->type.dtype, dims));
    visit_dtype(t.dtype(), [&]<typename T>() {
      T* p = t.data<T>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        if constexpr (std::is_same_v<T, bool>) p[i] = rng() % 2;
        else if constexpr (std::is_integral_v<T>) p[i] = T(rng() % int_range);
        else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) p[i] = T(uni(rng));
        else if constexpr (std::is_constructible_v<T, float>) p[i] = T(uni(rng));
      }
    });
    out.emplace_back(std::move(t));
  }
  return out;
}

Expected<std::vector<Data>> run_cpu(const Graph& g, const std::vector<Data>& inputs) {
  auto backend = make_cpu_backend();
  KILN_ASSIGN_OR_RETURN(auto exe, backend->compile(g));
  return exe->run(inputs);
}

void expect_close(const Tensor& want, const Tensor& got, const std::string& where) {
  ASSERT_EQ(want.dtype(), got.dtype()) << where;
  ASSERT_EQ(want.dims(), got.dims()) << where;
  const bool is_float = !dtype_is_int(want.dtype()) && want.dtype() != DType::kBool;
  // Half outputs: a fusion rounds once where the decomposed graph rounded after every node, so
  // allow two steps of the format (f16: 2^-10, bf16: 2^-7) rather than f32's 1e-4; outputs are
  // sums of rounded terms, so small ones also get that much of the largest.
  const bool half = want.dtype() == DType::kFloat16 || want.dtype() == DType::kBFloat16;
  const double rel = want.dtype() == DType::kFloat16 ? 2e-3 : want.dtype() == DType::kBFloat16 ? 1.6e-2 : 1e-4;
  double largest = 0;
  for (int64_t i = 0; half && i < want.numel(); ++i) largest = std::max(largest, std::abs(want.as_double(i)));
  const double atol = half ? rel * largest : 1e-5;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double a = want.as_double(i), b = got.as_double(i);
    if (is_float && std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b)) << where << " element " << i;
    } else if (is_float) {
      EXPECT_LE(std::abs(a - b), rel * std::max(std::abs(a), std::abs(b)) + atol) << where << " element " << i;
    } else {
      EXPECT_EQ(a, b) << where << " element " << i;
    }
  }
}

void expect_same_outputs(const Graph& before, const Graph& after) {
  for (uint64_t seed : {1, 2}) {
    auto inputs = random_inputs(before, seed);
    ASSERT_TRUE(inputs) << inputs.status().message();
    auto want = run_cpu(before, *inputs);
    ASSERT_TRUE(want) << "input graph: " << want.status().message();
    auto got = run_cpu(after, *inputs);
    ASSERT_TRUE(got) << "output graph: " << got.status().message();
    ASSERT_EQ(want->size(), got->size());
    for (size_t i = 0; i < want->size(); ++i) {
      ASSERT_TRUE((*want)[i].is_tensor() && (*got)[i].is_tensor());
      expect_close((*want)[i].tensor, (*got)[i].tensor, "output '" + before.outputs[i]->name + "'");
    }
  }
}

// The tensor-parallel golden's numerics: rank 0's graph (`rank0`, the pass's result) and the other
// ranks' (the same input split for them) run on threads joined by the reference collectives; every
// rank's outputs must equal rank 0's bit for bit, and rank 0's the unsplit graph's. Integer inputs
// (token ids) range over 8 values so that every rank's rows of an embedding are looked up.
// `int_range` as random_inputs takes it; `lenient`: an unsplit graph that cannot run on the random
// inputs (indices a case chose by hand) is skipped rather than failed.
void expect_same_outputs_over_ranks(const Graph& before, const std::string& input, const Graph& rank0, int ranks,
                                    uint64_t int_range = 8, bool lenient = false) {
  std::vector<std::unique_ptr<Graph>> others;
  std::vector<const Graph*> graphs = {&rank0};
  for (int r = 1; r < ranks; ++r) {
    auto g = parse_graph(input);
    ASSERT_TRUE(g) << g.status().message();
    auto changed = shard_tensor_parallel(**g, ranks, r);
    ASSERT_TRUE(changed) << changed.status().message();
    graphs.push_back(g->get());
    others.push_back(std::move(*g));
  }
  for (uint64_t seed : {1, 2}) {
    auto inputs = random_inputs(before, seed, int_range);
    ASSERT_TRUE(inputs) << inputs.status().message();
    auto want = run_cpu(before, *inputs);
    if (!want && lenient) return;
    ASSERT_TRUE(want) << "input graph: " << want.status().message();
    ThreadComm comm(ranks);
    std::vector<std::optional<Expected<std::vector<Data>>>> got(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        ScopedComm scope(&comm, r);
        got[size_t(r)].emplace(run_cpu(*graphs[size_t(r)], *inputs));
        if (!*got[size_t(r)]) comm.abort();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < ranks; ++r) ASSERT_TRUE(*got[size_t(r)]) << "rank " << r << ": " << got[size_t(r)]->status().message();
    const std::vector<Data>& out0 = **got[0];
    ASSERT_EQ(want->size(), out0.size());
    for (size_t i = 0; i < want->size(); ++i) {
      expect_close((*want)[i].tensor, out0[i].tensor, "output '" + before.outputs[i]->name + "'");
      for (int r = 1; r < ranks; ++r) {
        const Tensor& t = (**got[size_t(r)])[i].tensor;
        ASSERT_EQ(t.nbytes(), out0[i].tensor.nbytes());
        EXPECT_EQ(std::memcmp(t.raw(), out0[i].tensor.raw(), t.nbytes()), 0) << "rank " << r << " output " << i;
      }
    }
  }
}

// ---- the goldens ----------------------------------------------------------------------------

class PassGolden : public testing::TestWithParam<Case> {};

TEST_P(PassGolden, MatchesAndComputesTheSame) {
  const Case& c = GetParam();
  SCOPED_TRACE(c.file + ":" + std::to_string(c.line) + ": " + c.title);
  // tensor-parallel.kir: rank 0 of 2.
  const bool tp = c.pass == "tensor-parallel";
  std::vector<Pass> passes = tp ? tensor_parallel_pipeline(2, 0, nullptr) : default_pipeline();
  const Pass* pass = find_pass(passes, c.pass);
  ASSERT_NE(pass, nullptr) << "no pass named '" << c.pass << "' (the file's name) in default_pipeline()";
  auto g = parse_graph(c.input);
  ASSERT_TRUE(g) << g.status().message();
  auto before = parse_graph(c.input);
  ASSERT_TRUE(before);
  ASSERT_TRUE(verify_graph(**g)) << "the input does not verify: " << verify_graph(**g).message();
  const std::string printed_input = print_graph(**g);

  Expected<bool> changed = pass->run(**g);
  ASSERT_TRUE(changed) << changed.status().message();
  Status v = verify_graph(**g);
  ASSERT_TRUE(v) << "the result does not verify: " << v.message() << "\n" << print_graph(**g);
  if (c.unchanged) {
    EXPECT_FALSE(*changed) << "the pass says it changed the graph";
    EXPECT_EQ(print_graph(**g), printed_input);
  } else {
    EXPECT_TRUE(*changed) << "the pass says it left the graph alone";
    EXPECT_EQ(trim(print_graph(**g)), trim(c.expect));
  }
  if (tp && !c.unchanged) {
    expect_same_outputs_over_ranks(**before, c.input, **g, 2);
  } else {
    expect_same_outputs(**before, **g);
  }
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string n = info.param.pass + "_line" + std::to_string(info.param.line);
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Goldens, PassGolden, testing::ValuesIn(all_cases()), case_name);

// Every golden's input graph (attention, norms, QDQ, convolutions, control flow...) split over 2 and
// 3 ranks: the pass either leaves it alone, refuses it with an error (symbolic shapes), or splits
// it so that all ranks together compute what the graph did.
TEST(TensorParallelOnGoldens, EveryGoldenGraphSplitsCorrectlyOrStaysWhole) {
  int split = 0;
  for (const Case& c : all_cases()) {
    for (int ranks : {2, 3}) {
      SCOPED_TRACE(c.file + ":" + std::to_string(c.line) + ": " + c.title + ", " + std::to_string(ranks) + " ranks");
      auto g = parse_graph(c.input);
      auto before = parse_graph(c.input);
      ASSERT_TRUE(g && before);
      auto changed = shard_tensor_parallel(**g, ranks, 0);
      if (!changed) {
        EXPECT_EQ(changed.status().code(), ErrorCode::kInvalidArgument) << changed.status().message();
        continue;
      }
      Status v = verify_graph(**g);
      ASSERT_TRUE(v) << v.message();
      if (!*changed) continue;
      ++split;
      expect_same_outputs_over_ranks(**before, c.input, **g, ranks, 3, /*lenient=*/true);
    }
  }
  EXPECT_GE(split, 4);  // tensor-parallel.kir alone holds four graphs that split over 2 ranks
}

// Found by fuzz_ir_text (the text IR takes declared types and constants as written): a Split whose
// declared outputs have another rank than its input sent the split axis past the output's dims;
// Split sizes held as i32 were read as i64.
TEST(TensorParallelOnGoldens, MalformedGraphsStopTheSplit) {
  for (const char* sizes_and_types : {"dense<i64[3]> [4, 4, 4]|f32[1,7]", "dense<i32[3]> [4, 4, 4]|f32[1,3,4]"}) {
    const std::string spec = sizes_and_types;
    const std::string sizes = spec.substr(0, spec.find('|')), q_type = spec.substr(spec.find('|') + 1);
    auto g = parse_graph("graph main(%x: f32[1,3,4]) {\n  %w = const dense<f32[4,12]> [1]\n"
                         "  %qkv = MatMul(%x, %w) : f32[1,3,12]\n  %sizes = const " + sizes + "\n"
                         "  %q, %k, %v = Split(%qkv, %sizes) {axis = 2} : " + q_type + ", f32[1,3,4], f32[1,3,4]\n"
                         "  return %q, %k, %v\n}");
    ASSERT_TRUE(g) << g.status().message();
    for (int rank = 0; rank < 2; ++rank) {
      auto c = parse_graph(print_graph(**g));
      ASSERT_TRUE(c);
      // No crash; a declared rank the Split cannot have keeps the product whole, i32 sizes are read.
      auto changed = shard_tensor_parallel(**c, 2, rank);
      ASSERT_TRUE(changed) << changed.status().message();
      EXPECT_EQ(*changed, q_type == "f32[1,3,4]") << sizes_and_types;
      EXPECT_TRUE(verify_graph(**c)) << sizes_and_types;
    }
  }
}

TEST(PassGoldenFiles, EveryPipelinePassHasAGoldenFile) {
  for (const Pass& p : default_pipeline()) {
    EXPECT_TRUE(fs::exists(fs::path(KILN_PASS_TESTS_DIR) / (p.name + ".kir"))) << p.name;
  }
}

}  // namespace
}  // namespace kiln
