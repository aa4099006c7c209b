// libFuzzer target for calibration folders and the QDQ models made from them (`kiln quantize
// model.onnx --calib DIR`, kiln::quantize): bytes -> a calibration folder of .npy files -> kiln::quantize
// on a small fixed model (two inputs; convolutions, a MatMul, a classifier GEMM) -> the QDQ model it
// writes read back by the importer (quantize itself runs it on the CPU to measure its accuracy). Calibration folders come from users, and
// from scripts that can write anything; an error Status is a fine answer, a crash, sanitizer report,
// hang or a written model that does not import again is a finding.
//
//   bash tests/fuzz/run.sh build-fuzz 60        (or: make fuzz; this target gets a quarter of the time)
//   build-fuzz/tests/kiln_fuzz_calib build-fuzz/artifacts-calib/crash-...   (replay one input)
//
// Input bytes: one options byte, then records `u8 path length, path, u32 little-endian data length,
// data`, each a file of the folder. Options: bit 0 fp8 (else int8), bits 1-2 the method (minmax,
// percentile, entropy, minmax), bit 3 quantize the sensitive layers too, bit 4 the per-layer
// sensitivity report, bit 5 a 1% accuracy budget. A path is [A-Za-z0-9._-] names, at most one
// folder deep; a record that is not one ends the folder (the layouts are what calibration.h reads,
// not path handling), and a data length past the input's end is cut to what is there, so that
// mutations inside a record still reach the loader. tests/fuzz/run.sh writes seeds in this format
// for every layout and dtype.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "frontend/onnx/importer.h"
#include "ir/tensor.h"
#include "kiln/quantize.h"
#include "onnx/onnx-ml.pb.h"
#include "support/mapped_file.h"

namespace {

namespace fs = std::filesystem;

fs::path g_root;  // this process's folder: model.onnx, calib/, out.onnx

void ignore_protobuf_log(google::protobuf::LogLevel, const char*, int, const std::string&) {}

void add_weight(onnx::GraphProto* g, const std::string& name, std::initializer_list<int64_t> dims, float scale) {
  onnx::TensorProto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  int64_t n = 1;
  for (int64_t d : dims) {
    t->add_dims(d);
    n *= d;
  }
  // Deterministic values of both signs and several magnitudes, so every layer has a real range.
  for (int64_t i = 0; i < n; ++i) t->add_float_data(scale * float((i * 37) % 19 - 9) / 9.0f);
}

void add_input(onnx::GraphProto* g, const std::string& name, std::initializer_list<int64_t> dims) {
  onnx::ValueInfoProto* v = g->add_input();
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = tt->mutable_shape();
  shape->add_dim()->set_dim_param("N");
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::initializer_list<std::string> in,
                          const std::string& out) {
  onnx::NodeProto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (const auto& s : in) n->add_input(s);
  n->add_output(out);
  return n;
}

// image [N,3,6,6] -> Conv 3x3 (the first convolution: kept in float unless asked) -> Relu -> Conv 3x3
// -> GlobalAveragePool -> Flatten -> MatMul [4,10] -> + "offset/1" [N,10] -> Gemm [10,12] (the
// classifier, not square so that a transposed weight shows) -> logits [N,12] (top-1 and top-5
// measured). "offset/1" is written offset_1.npy in a folder.
std::string small_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("calib_fuzz");
  add_input(g, "image", {3, 6, 6});
  add_input(g, "offset/1", {10});
  add_weight(g, "w1", {4, 3, 3, 3}, 0.5f);
  add_weight(g, "b1", {4}, 0.1f);
  add_weight(g, "w2", {4, 4, 3, 3}, 0.3f);
  add_weight(g, "w3", {4, 10}, 1.0f);
  add_weight(g, "w4", {10, 12}, 0.7f);
  add_weight(g, "b4", {12}, 0.2f);
  auto pads = [](onnx::NodeProto* n) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("pads");
    a->set_type(onnx::AttributeProto::INTS);
    for (int i = 0; i < 4; ++i) a->add_ints(1);
  };
  pads(add_node(g, "Conv", {"image", "w1", "b1"}, "c1"));
  add_node(g, "Relu", {"c1"}, "r1");
  pads(add_node(g, "Conv", {"r1", "w2"}, "c2"));
  add_node(g, "GlobalAveragePool", {"c2"}, "p");
  add_node(g, "Flatten", {"p"}, "f");
  add_node(g, "MatMul", {"f", "w3"}, "m");
  add_node(g, "Add", {"m", "offset/1"}, "a");
  add_node(g, "Gemm", {"a", "w4", "b4"}, "logits");
  onnx::ValueInfoProto* out = g->add_output();
  out->set_name("logits");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m.SerializeAsString();
}

bool valid_name(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

// Writes the records of `data` under `dir`, up to the first that is not one; false when the folder
// cannot be written.
bool write_folder(const uint8_t* data, size_t size, const fs::path& dir) {
  size_t at = 0;
  for (int records = 0; at < size && records < 32; ++records) {
    const size_t path_len = data[at++];
    if (path_len == 0 || at + path_len + 4 > size) return true;
    const std::string path(reinterpret_cast<const char*>(data + at), path_len);
    at += path_len;
    const uint32_t len = uint32_t(data[at]) | uint32_t(data[at + 1]) << 8 | uint32_t(data[at + 2]) << 16 |
                         uint32_t(data[at + 3]) << 24;
    at += 4;
    const size_t n = std::min<size_t>(len, size - at);
    const size_t slash = path.find('/');
    fs::path file = dir;
    if (slash == std::string::npos) {
      if (!valid_name(path)) return true;
      file /= path;
    } else {
      const std::string folder = path.substr(0, slash), name = path.substr(slash + 1);
      if (!valid_name(folder) || !valid_name(name)) return true;
      std::error_code ec;
      fs::create_directories(dir / folder, ec);
      if (ec) return false;
      file = dir / folder / name;
    }
    std::ofstream f(file, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data + at), std::streamsize(n));
    if (!f) return false;
    at += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(ignore_protobuf_log);
  kiln::set_max_tensor_bytes(int64_t{16} << 20);
  std::error_code ec;
  fs::path tmp = fs::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  g_root = tmp / ("kiln-fuzz-calib-" + std::to_string(getpid()));
  fs::create_directories(g_root, ec);
  std::ofstream(g_root / "model.onnx", std::ios::binary) << small_model();
  std::atexit([] {
    std::error_code e;
    fs::remove_all(g_root, e);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const fs::path calib = g_root / "calib", out = g_root / "out.onnx";
  std::error_code ec;
  fs::remove_all(calib, ec);
  fs::remove(out, ec);
  fs::create_directories(calib, ec);
  if (ec || !write_folder(data + 1, size - 1, calib)) return 0;

  const uint8_t o = data[0];
  kiln::QuantizeConfig c;
  c.precision = (o & 1) ? kiln::QuantPrecision::kFp8 : kiln::QuantPrecision::kInt8;
  static constexpr kiln::CalibrationMethod kMethods[4] = {
      kiln::CalibrationMethod::kMinMax, kiln::CalibrationMethod::kPercentile, kiln::CalibrationMethod::kEntropy,
      kiln::CalibrationMethod::kMinMax};
  c.method = kMethods[(o >> 1) & 3];
  c.quantize_sensitive = (o >> 3) & 1;
  c.sensitivity = (o >> 4) & 1;
  c.accuracy_budget = ((o >> 5) & 1) ? 1.0 : 0.0;
  c.calib_dir = calib.string();
  c.max_calib_samples = 16;  // keep each run short; the loader still reads and checks every file
  kiln::Expected<kiln::QuantizeReport> r = kiln::quantize((g_root / "model.onnx").string(), out.string(), c);
  if (!r) return 0;
  // A model kiln wrote must be one kiln reads: the QDQ file is what users hand to onnxruntime,
  // TensorRT and `kiln build`.
  kiln::Expected<std::shared_ptr<const kiln::MappedFile>> file = kiln::map_file(out.string());
  kiln::Expected<kiln::Model> back =
      file ? kiln::import_onnx_bytes((*file)->p, (*file)->size, g_root.string())
           : kiln::Expected<kiln::Model>(file.status());
  if (!back) {
    std::fprintf(stderr, "kiln_fuzz_calib: quantize succeeded but its model does not import: %s\n",
                 back.status().message().c_str());
    std::abort();
  }
  return 0;
}
