// `kiln compare model.onnx --inputs DIR --reference DIR [--rtol R --atol A]`: runs the model on
// DIR/<input>.npy and checks every output against DIR/<output>.npy of the reference. An element
// passes when |got - want| <= atol + rtol * |want| (NaN matches NaN); integers, bools and
// strings must match exactly. Exit 1 on any mismatch.
#include <cmath>
#include <filesystem>

#include "cli.h"
#include "support/npy.h"

namespace kiln::cli {

namespace {

struct Stats {
  double max_abs = 0, max_rel = 0, cosine = 1;
  int64_t bad = 0, first_bad = -1;
};

Stats compare_values(const Tensor& want, const Tensor& got, double rtol, double atol) {
  Stats s;
  double dot = 0, nw = 0, ng = 0;
  bool exact = !dtype_is_float(want.dtype()) || !dtype_is_float(got.dtype());
  for (int64_t i = 0; i < want.numel(); ++i) {
    bool ok;
    if (want.dtype() == DType::kString) {
      ok = want.data<std::string>()[i] == got.data<std::string>()[i];
      s.max_abs = std::max(s.max_abs, ok ? 0.0 : 1.0);
    } else {
      double w = want.as_double(i), g = got.as_double(i);
      if (std::isnan(w) || std::isnan(g)) {
        ok = std::isnan(w) && std::isnan(g);
      } else if (std::isinf(w) || std::isinf(g)) {
        ok = w == g;
      } else {
        double d = std::fabs(g - w);
        s.max_abs = std::max(s.max_abs, d);
        if (w != 0) s.max_rel = std::max(s.max_rel, d / std::fabs(w));
        ok = exact ? d == 0 : d <= atol + rtol * std::fabs(w);
        dot += w * g;
        nw += w * w;
        ng += g * g;
      }
    }
    if (!ok && s.bad++ == 0) s.first_bad = i;
  }
  if (nw > 0 && ng > 0) s.cosine = dot / std::sqrt(nw * ng);
  else if (nw != ng) s.cosine = 0;  // one side all zeros, the other not
  return s;
}

}  // namespace

int compare_main(const LoadOptions& load, const RunOptions& run, const CompareOptions& opt, const EngineOptions& eng) {
  namespace fs = std::filesystem;
  if (!(opt.rtol >= 0) || !(opt.atol >= 0)) return fail(KILN_ERROR(kInvalidArgument, "--rtol and --atol must be >= 0"));
  // The inputs folder's .npy files by stem (NAME.npy, or the file stem of a name: kiln run's output names).
  std::map<std::string, std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(opt.inputs_dir, ec)) {
    if (entry.path().extension() == ".npy") files.emplace(entry.path().stem().string(), entry.path().string());
  }
  auto engine = open_engine_for_files(load, eng, 0, files);
  if (!engine) return fail(engine.status());
  RunOptions with_shapes = run;
  if (is_engine_file(load.model)) {
    auto rs = engine_run_shapes(*engine, load);
    if (!rs) return fail(rs.status());
    with_shapes.run_shapes = *rs;
  }
  auto inputs = gather_inputs(*engine, with_shapes, opt.inputs_dir);
  if (!inputs) return fail(inputs.status());
  // Read every reference before running, so a missing file fails fast.
  std::vector<Tensor> refs;
  for (const TensorInfo& o : engine->outputs()) {
    std::string path = (fs::path(opt.reference_dir) / (file_name_for(o.name) + ".npy")).string();
    auto t = read_npy(path);
    if (!t) return fail(t.status().with_context(fmt::format("reference for output '{}'", o.name)));
    refs.push_back(std::move(*t));
  }
  auto session = engine->create_session();
  if (!session) return fail(session.status());
  auto host = session->run(views(*inputs));
  if (!host) return fail(host.status());
  std::vector<Data> outs;
  for (HostTensor& h : *host) outs.emplace_back(from_host(std::move(h)));
  std::printf("backend: %s\n", std::string(device_name(engine->device())).c_str());
  bool all_ok = true;
  std::printf("%-28s %-16s %12s %12s %10s  %s\n", "output", "shape", "max_abs", "max_rel", "cosine", "result");
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string& name = engine->outputs()[i].name;
    const Data& d = outs[i];
    const Tensor& want = refs[i];
    std::string verdict;
    if (!d.is_tensor()) {
      verdict = fmt::format("MISMATCH: kiln produced {}, the reference is a tensor", d.summary());
    } else if (d.tensor.dims() != want.dims()) {
      verdict = fmt::format("MISMATCH: shape {} vs reference {}", dims_to_string(d.tensor.dims()), dims_to_string(want.dims()));
    } else if ((d.tensor.dtype() == DType::kString) != (want.dtype() == DType::kString) ||
               (dtype_is_float(d.tensor.dtype()) != dtype_is_float(want.dtype()))) {
      verdict = fmt::format("MISMATCH: dtype {} vs reference {}", dtype_name(d.tensor.dtype()), dtype_name(want.dtype()));
    }
    if (!verdict.empty()) {
      all_ok = false;
      std::printf("%-28s %-16s %12s %12s %10s  %s\n", name.c_str(), "", "", "", "", verdict.c_str());
      continue;
    }
    Stats s = compare_values(want, d.tensor, opt.rtol, opt.atol);
    if (s.bad) {
      all_ok = false;
      verdict = fmt::format("MISMATCH: {} of {} elements out of tolerance; first at flat index {}: {} vs {}", s.bad,
                            want.numel(), s.first_bad,
                            want.dtype() == DType::kString ? d.tensor.data<std::string>()[s.first_bad]
                                                           : fmt::format("{:.7g}", d.tensor.as_double(s.first_bad)),
                            want.dtype() == DType::kString ? want.data<std::string>()[s.first_bad]
                                                           : fmt::format("{:.7g}", want.as_double(s.first_bad)));
    } else {
      verdict = "ok";
    }
    std::printf("%-28s %-16s %12.4g %12.4g %10.7f  %s\n", name.c_str(), dims_to_string(want.dims()).c_str(), s.max_abs,
                s.max_rel, s.cosine, verdict.c_str());
  }
  std::printf("%s (rtol %g, atol %g)\n", all_ok ? "PASS" : "FAIL", opt.rtol, opt.atol);
  return all_ok ? 0 : 1;
}

}  // namespace kiln::cli
