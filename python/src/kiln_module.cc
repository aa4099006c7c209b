// kiln._kiln: the Python binding of include/kiln (nanobind). Thin: every call is the C++ API's, with
// kiln's one-line errors raised as kiln.KilnError and the GIL released while kiln works. The
// friendlier surface (output_names, dict inputs, from_torch) is python/kiln/__init__.py.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kiln/kiln.h"

#ifdef KILN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace {

struct KilnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
T take(kiln::Expected<T> e) {
  if (!e) throw KilnError(e.status().message());
  return std::move(*e);
}

void check(const kiln::Status& s) {
  if (!s) throw KilnError(s.message());
}

// numpy's name for a kiln dtype ("float32"); the types numpy lacks keep kiln's name ("bfloat16").
std::string numpy_name(kiln::DType t) {
  using D = kiln::DType;
  switch (t) {
    case D::kFloat32: return "float32";
    case D::kFloat64: return "float64";
    case D::kFloat16: return "float16";
    case D::kBFloat16: return "bfloat16";
    case D::kInt8: return "int8";
    case D::kInt16: return "int16";
    case D::kInt32: return "int32";
    case D::kInt64: return "int64";
    case D::kUInt8: return "uint8";
    case D::kUInt16: return "uint16";
    case D::kUInt32: return "uint32";
    case D::kUInt64: return "uint64";
    case D::kBool: return "bool";
    case D::kString: return "str";
    case D::kFloat8E4M3FN: return "float8_e4m3fn";
    case D::kFloat8E4M3FNUZ: return "float8_e4m3fnuz";
    case D::kFloat8E5M2: return "float8_e5m2";
    case D::kFloat8E5M2FNUZ: return "float8_e5m2fnuz";
    case D::kUInt4: return "uint4";
    case D::kInt4: return "int4";
    case D::kFloat4E2M1: return "float4_e2m1";
    case D::kUInt2: return "uint2";
    case D::kInt2: return "int2";
  }
  return "?";
}

// The kiln dtype of a DLPack dtype, or nullopt.
std::optional<kiln::DType> from_dlpack(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  using D = kiln::DType;
  if (d.lanes != 1) return std::nullopt;
  switch (C(d.code)) {
    case C::Float:
      if (d.bits == 32) return D::kFloat32;
      if (d.bits == 64) return D::kFloat64;
      if (d.bits == 16) return D::kFloat16;
      break;
    case C::Bfloat:
      if (d.bits == 16) return D::kBFloat16;
      break;
    case C::Int:
      if (d.bits == 8) return D::kInt8;
      if (d.bits == 16) return D::kInt16;
      if (d.bits == 32) return D::kInt32;
      if (d.bits == 64) return D::kInt64;
      break;
    case C::UInt:
      if (d.bits == 8) return D::kUInt8;
      if (d.bits == 16) return D::kUInt16;
      if (d.bits == 32) return D::kUInt32;
      if (d.bits == 64) return D::kUInt64;
      break;
    case C::Bool:
      return D::kBool;
    default:
      break;
  }
  return std::nullopt;
}

nb::dlpack::dtype to_dlpack(kiln::DType t) {
  using D = kiln::DType;
  switch (t) {
    case D::kFloat32: return nb::dtype<float>();
    case D::kFloat64: return nb::dtype<double>();
    case D::kFloat16: return nb::dlpack::dtype{uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case D::kInt8: return nb::dtype<int8_t>();
    case D::kInt16: return nb::dtype<int16_t>();
    case D::kInt32: return nb::dtype<int32_t>();
    case D::kInt64: return nb::dtype<int64_t>();
    case D::kUInt8: return nb::dtype<uint8_t>();
    case D::kUInt16: return nb::dtype<uint16_t>();
    case D::kUInt32: return nb::dtype<uint32_t>();
    case D::kUInt64: return nb::dtype<uint64_t>();
    case D::kBool: return nb::dtype<bool>();
    default: break;
  }
  throw KilnError("output of type " + numpy_name(t) + " has no numpy dtype");
}

nb::dict info_dict(const kiln::TensorInfo& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = numpy_name(t.dtype);
  nb::list shape;
  for (int64_t x : t.shape) {
    if (x < 0) shape.append(nb::none());
    else shape.append(x);
  }
  d["shape"] = shape;
  d["min_shape"] = t.min_shape;
  d["max_shape"] = t.max_shape;
  d["dim_names"] = t.dim_names;
  return d;
}

// One output as a numpy array sharing kiln's buffer (no copy); float types numpy lacks (bfloat16,
// float8) are widened to float32, as `kiln run` writes them.
nb::object to_numpy(kiln::HostTensor t) {
  using D = kiln::DType;
  if (t.dtype() == D::kString) {
    nb::list items;
    for (int64_t i = 0; i < t.numel(); ++i) items.append(nb::str(t.data<std::string>()[i].c_str()));
    nb::object np = nb::module_::import_("numpy");
    return np.attr("array")(items, "dtype"_a = "object").attr("reshape")(nb::cast(t.shape()));
  }
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  if (t.dtype() == D::kBFloat16 || t.dtype() == D::kFloat8E4M3FN || t.dtype() == D::kFloat8E4M3FNUZ ||
      t.dtype() == D::kFloat8E5M2 || t.dtype() == D::kFloat8E5M2FNUZ) {
    throw KilnError("output of type " + numpy_name(t.dtype()) + ": numpy has no such dtype; build the engine with "
                    "an fp32 output");
  }
  auto* owned = new kiln::HostTensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<kiln::HostTensor*>(p); });
  return nb::cast(nb::ndarray<nb::numpy>(owned->raw(), shape.size(), shape.data(), owner, nullptr, to_dlpack(owned->dtype())));
}

kiln::DimRange parse_range(nb::handle h) {
  if (nb::isinstance<nb::int_>(h)) {
    int64_t v = nb::cast<int64_t>(h);
    return {v, v, 0};
  }
  auto t = nb::cast<std::vector<int64_t>>(h);
  if (t.size() < 2 || t.size() > 3) throw KilnError("a shape range is (min, max) or (min, max, opt)");
  return {t[0], t[1], t.size() == 3 ? t[2] : 0};
}

kiln::BuildConfig make_config(const std::string& device, const std::string& precision,
                              const std::map<std::string, std::vector<int64_t>>& shapes, int64_t batch,
                              const nb::dict& shape_ranges,
                              const std::vector<std::map<std::string, std::vector<int64_t>>>& warm_shapes,
                              const std::vector<std::string>& disabled_passes,
                              bool autotune, bool cuda_graph, int64_t memory_budget_mib, const std::string& timing_cache,
                              int tensor_parallel, int micro_batches, bool deterministic, const std::string& target) {
  kiln::BuildConfig c;
  if (device == "auto") c.device = kiln::Device::kAuto;
  else if (device == "cpu") c.device = kiln::Device::kCpu;
  else if (device == "cuda") c.device = kiln::Device::kCuda;
  else if (device == "cpu-ref") c.device = kiln::Device::kCpuRef;
  else throw KilnError("device is 'auto', 'cpu', 'cpu-ref' or 'cuda', not '" + device + "'");
  if (precision == "fp32") c.precision = kiln::Precision::kFp32;
  else if (precision == "tf32") c.precision = kiln::Precision::kTf32;
  else if (precision == "fp16") c.precision = kiln::Precision::kFp16;
  else if (precision == "bf16") c.precision = kiln::Precision::kBf16;
  else throw KilnError("precision is 'fp32', 'tf32', 'fp16' or 'bf16', not '" + precision + "'");
  c.shapes = shapes;
  c.batch = batch;
  for (auto [name, dims] : shape_ranges) {
    std::vector<kiln::DimRange> r;
    for (nb::handle d : dims) r.push_back(parse_range(d));
    c.shape_ranges[nb::cast<std::string>(name)] = r;
  }
  c.warm_shapes = warm_shapes;
  c.disabled_passes = disabled_passes;
  c.autotune = autotune;
  c.cuda_graph = cuda_graph;
  if (memory_budget_mib < 0) throw KilnError("memory_budget_mib must be >= 0");
  c.memory_budget_bytes = size_t(memory_budget_mib) << 20;
  c.timing_cache = timing_cache;
  c.tensor_parallel = tensor_parallel;
  c.micro_batches = micro_batches;
  c.deterministic = deterministic;
  if (target == "edge") c.target = kiln::Target::kEdge;
  else if (target != "server") throw KilnError("target is 'server' or 'edge', not '" + target + "'");
  return c;
}

// Inputs in engine order: host arrays (numpy, or any CPU DLPack tensor) or, for a GPU engine, CUDA
// tensors (torch, CuPy, any DLPack producer), C-contiguous; `device` is set when any is on the GPU.
std::vector<kiln::TensorView> views(const kiln::Engine& e, const std::vector<nb::ndarray<nb::c_contig>>& arrays,
                                    bool& device) {
  const auto& ins = e.inputs();
  if (arrays.size() != ins.size()) {
    throw KilnError("expected " + std::to_string(ins.size()) + " inputs, got " + std::to_string(arrays.size()));
  }
  std::vector<kiln::TensorView> v;
  device = false;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    const bool on_gpu = a.device_type() == nb::device::cuda::value;
    if (!on_gpu && a.device_type() != nb::device::cpu::value) {
      throw KilnError("input '" + ins[i].name + "' is in memory kiln cannot read (DLPack device type " +
                      std::to_string(a.device_type()) + "): pass host arrays or CUDA tensors");
    }
    if (on_gpu && e.device() != kiln::Device::kCuda) {
      throw KilnError("input '" + ins[i].name + "' is on the GPU, but this engine runs on the " +
                      std::string(kiln::device_name(e.device())) + ": pass host arrays");
    }
    if (on_gpu) {
#ifdef KILN_HAVE_CUDA
      int current = 0;
      if (cudaGetDevice(&current) != cudaSuccess || a.device_id() != current) {
        throw KilnError("input '" + ins[i].name + "' is on GPU " + std::to_string(a.device_id()) + "; the engine runs on GPU " +
                        std::to_string(current));
      }
#endif
    }
    device |= on_gpu;
    auto dt = from_dlpack(a.dtype());
    if (!dt) throw KilnError("input '" + ins[i].name + "' has a dtype kiln does not take");
    std::vector<int64_t> shape;
    for (size_t k = 0; k < a.ndim(); ++k) shape.push_back(int64_t(a.shape(k)));
    v.push_back({*dt, std::move(shape), const_cast<void*>(a.data()), on_gpu});
  }
  return v;
}

// The outputs' shapes for these inputs: the engine's fixed dims, and each named dim (a dynamic
// engine's symbol) at the value an input gives it. A dim no input names depends on the data.
std::vector<std::vector<int64_t>> output_shapes(const kiln::Engine& e, const std::vector<kiln::TensorView>& in) {
  std::map<std::string, int64_t> bound;
  for (size_t i = 0; i < in.size(); ++i) {
    const kiln::TensorInfo& t = e.inputs()[i];
    for (size_t k = 0; k < t.shape.size() && k < t.dim_names.size() && k < in[i].shape.size(); ++k) {
      if (t.shape[k] < 0 && !t.dim_names[k].empty()) bound[t.dim_names[k]] = in[i].shape[k];
    }
  }
  std::vector<std::vector<int64_t>> out;
  for (const kiln::TensorInfo& t : e.outputs()) {
    std::vector<int64_t> shape = t.shape;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (shape[k] >= 0) continue;
      auto it = k < t.dim_names.size() ? bound.find(t.dim_names[k]) : bound.end();
      if (it == bound.end()) {
        throw KilnError("output '" + t.name + "': dim " + std::to_string(k) + " ('" +
                        (k < t.dim_names.size() ? t.dim_names[k] : std::string("?")) +
                        "') depends on the data, not on the inputs' shapes: pass host arrays to get it");
      }
      shape[k] = it->second;
    }
    out.push_back(std::move(shape));
  }
  return out;
}

struct PySession {
  kiln::Engine engine;  // keeps the engine alive as long as the session
  kiln::Session session;
  // `torch`: device outputs come back as torch tensors (else as DLPack-capable arrays).
  nb::list run(const std::vector<nb::ndarray<nb::c_contig>>& arrays, bool torch) {
    bool device = false;
    std::vector<kiln::TensorView> in = views(engine, arrays, device);
    if (device) return run_device(in, torch);
    std::vector<kiln::HostTensor> out;
    {
      nb::gil_scoped_release release;
      out = take(session.run(in));
    }
    nb::list result;
    for (kiln::HostTensor& t : out) result.append(to_numpy(std::move(t)));
    return result;
  }

  // Inputs read where they lie on the GPU and outputs written into new device memory (stream-ordered
  // allocations on the default stream, which the run and PyTorch's default stream follow): no host
  // copy either way.
  nb::list run_device(const std::vector<kiln::TensorView>& in, bool torch) {
#ifdef KILN_HAVE_CUDA
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) throw KilnError("no CUDA device for the GPU inputs");
    std::vector<std::vector<int64_t>> shapes = output_shapes(engine, in);
    std::vector<kiln::TensorView> out;
    std::vector<nb::capsule> owners;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const kiln::TensorInfo& t = engine.outputs()[k];
      if (t.dtype == kiln::DType::kString) throw KilnError("output '" + t.name + "' is strings: pass host arrays to get it");
      kiln::TensorView v{t.dtype, shapes[k], nullptr, true};
      if (cudaMallocAsync(&v.data, std::max<size_t>(v.bytes(), 1), nullptr) != cudaSuccess) {
        cudaGetLastError();
        throw KilnError("output '" + t.name + "': out of GPU memory for " + std::to_string(v.bytes()) + " bytes");
      }
      owners.emplace_back(v.data, [](void* p) noexcept { cudaFreeAsync(p, nullptr); });
      out.push_back(std::move(v));
    }
    {
      nb::gil_scoped_release release;
      check(session.run(in, out, nullptr));
    }
    nb::list result;
    for (size_t k = 0; k < out.size(); ++k) {
      std::vector<size_t> shape(out[k].shape.begin(), out[k].shape.end());
      const auto dt = to_dlpack(out[k].dtype);
      if (torch) {
        result.append(nb::cast(nb::ndarray<nb::pytorch, nb::device::cuda>(out[k].data, shape.size(), shape.data(), owners[k],
                                                                          nullptr, dt, nb::device::cuda::value, dev)));
      } else {
        result.append(nb::cast(nb::ndarray<nb::device::cuda>(out[k].data, shape.size(), shape.data(), owners[k], nullptr, dt,
                                                             nb::device::cuda::value, dev)));
      }
    }
    return result;
#else
    (void)in;
    (void)torch;
    throw KilnError("this kiln was built without CUDA: pass host arrays");
#endif
  }
};

}  // namespace

NB_MODULE(_kiln, m) {
  m.doc() = "kiln: compile ONNX models into engines and run them (the C++ API of include/kiln)";
  nb::exception<KilnError>(m, "KilnError", PyExc_RuntimeError);

  nb::class_<kiln::Engine>(m, "_Engine")
      .def_static("load", [](const std::string& path) {
        nb::gil_scoped_release release;
        return take(kiln::Engine::load(path));
      }, "path"_a)
      .def("save", [](const kiln::Engine& e, const std::string& path) {
        nb::gil_scoped_release release;
        check(e.save(path));
      }, "path"_a)
      .def_prop_ro("inputs", [](const kiln::Engine& e) {
        nb::list l;
        for (const auto& t : e.inputs()) l.append(info_dict(t));
        return l;
      })
      .def_prop_ro("outputs", [](const kiln::Engine& e) {
        nb::list l;
        for (const auto& t : e.outputs()) l.append(info_dict(t));
        return l;
      })
      .def_prop_ro("device", [](const kiln::Engine& e) { return std::string(kiln::device_name(e.device())); })
      .def_prop_ro("precision", [](const kiln::Engine& e) { return std::string(kiln::precision_name(e.config().precision)); })
      .def_prop_ro("weight_bytes", &kiln::Engine::weight_bytes)
      .def("report", &kiln::Engine::report)
      .def("create_session", [](const kiln::Engine& e) {
        nb::gil_scoped_release release;
        return new PySession{e, take(e.create_session())};
      });

  nb::class_<PySession>(m, "_Session").def("run", &PySession::run, "inputs"_a, "torch"_a = false);

  m.def("build", [](const std::string& path, const std::string& device, const std::string& precision,
                    const std::map<std::string, std::vector<int64_t>>& shapes, int64_t batch, const nb::dict& shape_ranges,
                    const std::vector<std::map<std::string, std::vector<int64_t>>>& warm_shapes,
                    const std::vector<std::string>& disabled_passes, bool autotune, bool cuda_graph,
                    int64_t memory_budget_mib, const std::string& timing_cache, int tensor_parallel, int micro_batches,
                    bool deterministic, const std::string& target) {
    kiln::BuildConfig c = make_config(device, precision, shapes, batch, shape_ranges, warm_shapes, disabled_passes, autotune,
                                      cuda_graph, memory_budget_mib, timing_cache, tensor_parallel, micro_batches,
                                      deterministic, target);
    nb::gil_scoped_release release;
    return take(kiln::build(path, c));
  }, "path"_a, "device"_a, "precision"_a, "shapes"_a, "batch"_a, "shape_ranges"_a, "warm_shapes"_a, "disabled_passes"_a,
     "autotune"_a, "cuda_graph"_a, "memory_budget_mib"_a, "timing_cache"_a, "tensor_parallel"_a, "micro_batches"_a, "deterministic"_a,
     "target"_a);

  m.def("quantize", [](const std::string& path, const std::string& out, const std::string& precision,
                       const std::string& method, const std::string& calib_dir, const std::string& eval_dir,
                       const std::vector<std::string>& keep, bool quantize_sensitive, double accuracy_budget,
                       const std::string& metric) {
    kiln::QuantizeConfig c;
    if (precision == "int8") c.precision = kiln::QuantPrecision::kInt8;
    else if (precision == "fp8") c.precision = kiln::QuantPrecision::kFp8;
    else throw KilnError("precision is 'int8' or 'fp8', not '" + precision + "'");
    if (method == "minmax") c.method = kiln::CalibrationMethod::kMinMax;
    else if (method == "percentile") c.method = kiln::CalibrationMethod::kPercentile;
    else if (method == "entropy") c.method = kiln::CalibrationMethod::kEntropy;
    else throw KilnError("method is 'minmax', 'percentile' or 'entropy', not '" + method + "'");
    if (metric == "auto") c.metric = kiln::AccuracyMetric::kAuto;
    else if (metric == "top1") c.metric = kiln::AccuracyMetric::kTop1;
    else if (metric == "rel-l2") c.metric = kiln::AccuracyMetric::kRelL2;
    else if (metric == "cosine") c.metric = kiln::AccuracyMetric::kCosine;
    else throw KilnError("metric is 'auto', 'top1', 'rel-l2' or 'cosine', not '" + metric + "'");
    c.calib_dir = calib_dir;
    c.eval_dir = eval_dir;
    c.keep = keep;
    c.quantize_sensitive = quantize_sensitive;
    c.accuracy_budget = accuracy_budget;
    nb::gil_scoped_release release;
    kiln::QuantizeReport r = take(kiln::quantize(path, out, c));
    return std::make_pair(r.text, r.json);
  }, "path"_a, "out"_a, "precision"_a, "method"_a, "calib_dir"_a, "eval_dir"_a, "keep"_a, "quantize_sensitive"_a,
     "accuracy_budget"_a, "metric"_a);
}
