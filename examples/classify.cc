// Build an engine from an ONNX classifier, save it, load it back and classify an image with both:
// the whole life of an engine through kiln's public API (include/kiln).
//
//   classify MODEL.onnx IMAGE.npy ENGINE.kiln [cpu|cuda|auto]
//
// IMAGE.npy is the preprocessed input (float32, C order, the model's input shape). Prints the
// five best classes and exits 1 if the loaded engine's scores differ from the built one's in any
// bit.
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int fail(const kiln::Status& s) {
  std::fprintf(stderr, "classify: %s\n", s.message().c_str());
  return 1;
}

// A float32, C-order .npy file (format 1.0 or 2.0), enough for this example.
bool read_npy_f32(const std::string& path, std::vector<float>& data, std::vector<int64_t>& shape) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) return false;
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    uint16_t n;
    f.read(reinterpret_cast<char*>(&n), 2);
    header_len = n;
  } else {
    f.read(reinterpret_cast<char*>(&header_len), 4);
  }
  std::string header(header_len, '\0');
  if (!f.read(header.data(), header_len)) return false;
  if (header.find("'<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos) return false;
  size_t open = header.find('(', header.find("'shape'")), close = header.find(')', open);
  std::string dims = header.substr(open + 1, close - open - 1);
  shape.clear();
  for (size_t i = 0; i < dims.size();) {
    size_t j = dims.find(',', i);
    std::string d = dims.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (d.find_first_of("0123456789") != std::string::npos) shape.push_back(std::stoll(d));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<>());
  data.resize(size_t(n));
  return bool(f.read(reinterpret_cast<char*>(data.data()), std::streamsize(n * 4)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: classify MODEL.onnx IMAGE.npy ENGINE.kiln [cpu|cuda|auto]\n");
    return 2;
  }
  std::vector<float> image;
  std::vector<int64_t> shape;
  if (!read_npy_f32(argv[2], image, shape)) {
    std::fprintf(stderr, "classify: %s: not a float32 C-order .npy file\n", argv[2]);
    return 1;
  }
  std::string device = argc > 4 ? argv[4] : "cpu";

  kiln::BuildConfig config;
  config.device = device == "cuda" ? kiln::Device::kCuda : device == "auto" ? kiln::Device::kAuto : kiln::Device::kCpu;
  config.batch = shape.empty() ? 0 : shape[0];  // a model exported with a symbolic batch gets the image's
  auto t0 = std::chrono::steady_clock::now();
  kiln::Expected<kiln::Engine> built = kiln::build(argv[1], config);
  if (!built) return fail(built.status());
  const double build_ms = ms_since(t0);
  const kiln::TensorInfo& in = built->inputs().at(0);
  std::printf("built a %s engine: input '%s' %s, %zu output(s), %.1f MiB of weights\n",
              kiln::device_name(built->device()).data(), in.name.c_str(), kiln::dtype_name(in.dtype).data(),
              built->outputs().size(), double(built->weight_bytes()) / (1 << 20));
  t0 = std::chrono::steady_clock::now();
  if (kiln::Status s = built->save(argv[3]); !s) return fail(s);
  const double save_ms = ms_since(t0);
  // Loading in a process that already runs kiln (its CUDA context and libraries are up): the
  // engine's own cost.
  t0 = std::chrono::steady_clock::now();
  kiln::Expected<kiln::Engine> loaded = kiln::Engine::load(argv[3]);
  if (!loaded) return fail(loaded.status());

  std::vector<std::vector<float>> scores;
  double first_ms = 0;
  for (const kiln::Engine* e : {&*loaded, &*built}) {
    kiln::Expected<kiln::Session> session = e->create_session();
    if (!session) return fail(session.status());
    kiln::TensorView view{kiln::DType::kFloat32, shape, image.data()};
    kiln::Expected<std::vector<kiln::HostTensor>> out = session->run({view});
    if (!out) return fail(out.status());
    if (scores.empty()) first_ms = ms_since(t0);
    const kiln::HostTensor& logits = out->at(0);
    if (logits.dtype() != kiln::DType::kFloat32) return fail(kiln::Status(kiln::ErrorCode::kInvalidArgument, "output 0 is not f32"));
    scores.emplace_back(logits.data<float>(), logits.data<float>() + logits.numel());
  }
  std::printf("build %.1f ms, save %.1f ms, load + session + first inference %.1f ms\n", build_ms, save_ms, first_ms);
  std::vector<int> order(scores[0].size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int a, int b) { return scores[0][size_t(a)] > scores[0][size_t(b)]; });
  std::printf("top 5:");
  for (int i = 0; i < 5; ++i) std::printf(" %d (%.3f)", order[size_t(i)], scores[0][size_t(order[size_t(i)])]);
  std::printf("\n");
  if (std::memcmp(scores[0].data(), scores[1].data(), scores[0].size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "classify: the loaded engine's scores differ from the built engine's\n");
    return 1;
  }
  std::printf("the engine loaded from %s gives bit-identical scores\n", argv[3]);
  return 0;
}
