#include "serve/kserve_grpc.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <climits>
#include <cstring>

#include "grpc_service.grpc.pb.h"
#include "model_config.pb.h"
#include "serve/kserve_codec.h"

namespace kiln::serve {

namespace {

grpc::Status to_grpc(const HttpError& e) {
  grpc::StatusCode c = grpc::StatusCode::INVALID_ARGUMENT;
  if (e.status == 404) c = grpc::StatusCode::NOT_FOUND;
  if (e.status == 503) c = grpc::StatusCode::UNAVAILABLE;
  if (e.status == 504) c = grpc::StatusCode::DEADLINE_EXCEEDED;
  if (e.status >= 500 && e.status != 503 && e.status != 504) c = grpc::StatusCode::INTERNAL;
  return grpc::Status(c, e.message);
}

// Runs a handler, turning what it throws into a gRPC status.
template <typename F>
grpc::Status guarded(F f) {
  try {
    f();
    return grpc::Status::OK;
  } catch (const HttpError& e) {
    return to_grpc(e);
  } catch (const std::bad_alloc&) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "out of host memory");
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what());
  }
}

// A typed contents list into the input's bytes (or strings), checking its length.
template <typename T, typename List>
void put_list(Input& in, const List& list, const char* field) {
  if (int64_t(list.size()) != in.count) {
    throw HttpError{400, "input '" + in.info->name + "': shape holds " + std::to_string(in.count) + " elements, " + field +
                             " has " + std::to_string(list.size())};
  }
  in.bytes.resize(list.size() * sizeof(T));
  T* p = reinterpret_cast<T*>(in.bytes.data());
  for (int i = 0; i < list.size(); ++i) {
    const auto v = list.Get(i);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
        throw HttpError{400, "input '" + in.info->name + "': element " + std::to_string(i) + " is out of range for its datatype"};
      }
    }
    p[i] = T(v);
  }
}

void decode_contents(Input& in, const inference::InferTensorContents& c) {
  switch (in.info->dtype) {
    case DType::kBool: return put_list<bool>(in, c.bool_contents(), "bool_contents");
    case DType::kUInt8: return put_list<uint8_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt16: return put_list<uint16_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt32: return put_list<uint32_t>(in, c.uint_contents(), "uint_contents");
    case DType::kUInt64: return put_list<uint64_t>(in, c.uint64_contents(), "uint64_contents");
    case DType::kInt8: return put_list<int8_t>(in, c.int_contents(), "int_contents");
    case DType::kInt16: return put_list<int16_t>(in, c.int_contents(), "int_contents");
    case DType::kInt32: return put_list<int32_t>(in, c.int_contents(), "int_contents");
    case DType::kInt64: return put_list<int64_t>(in, c.int64_contents(), "int64_contents");
    case DType::kFloat32: return put_list<float>(in, c.fp32_contents(), "fp32_contents");
    case DType::kFloat64: return put_list<double>(in, c.fp64_contents(), "fp64_contents");
    case DType::kString:
      if (int64_t(c.bytes_contents_size()) != in.count) {
        throw HttpError{400, "input '" + in.info->name + "': shape holds " + std::to_string(in.count) +
                                 " elements, bytes_contents has " + std::to_string(c.bytes_contents_size())};
      }
      in.strings.assign(c.bytes_contents().begin(), c.bytes_contents().end());
      return;
    default:
      throw HttpError{400, "input '" + in.info->name + "': its datatype has no typed contents; send raw_input_contents"};
  }
}

// The client's deadline on the steady clock (max when it set none or one past a day).
Clock::time_point steady_deadline(const grpc::ServerContext& ctx) {
  const auto left = ctx.deadline() - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

class Service final : public inference::GRPCInferenceService::Service {
 public:
  explicit Service(Repository& r) : repo_(r) {}

  grpc::Status ServerLive(grpc::ServerContext*, const inference::ServerLiveRequest*, inference::ServerLiveResponse* r) override {
    r->set_live(true);
    return grpc::Status::OK;
  }
  grpc::Status ServerReady(grpc::ServerContext*, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* r) override {
    r->set_ready(true);
    return grpc::Status::OK;
  }
  grpc::Status ModelReady(grpc::ServerContext*, const inference::ModelReadyRequest* q, inference::ModelReadyResponse* r) override {
    try {
      repo_.find(q->name(), q->version());
      r->set_ready(true);
    } catch (const HttpError&) {
      r->set_ready(false);
    }
    return grpc::Status::OK;
  }
  grpc::Status ServerMetadata(grpc::ServerContext*, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* r) override {
    r->set_name("kiln");
    r->set_version(KILN_SERVE_VERSION);
    for (const char* e : {"binary_tensor_data", "model_repository", "model_configuration"}) r->add_extensions(e);
    return grpc::Status::OK;
  }
  grpc::Status ModelMetadata(grpc::ServerContext*, const inference::ModelMetadataRequest* q,
                             inference::ModelMetadataResponse* r) override {
    return guarded([&] {
      auto m = repo_.find(q->name(), q->version());
      r->set_name(m->name());
      r->set_platform("kiln");
      for (int64_t v : repo_.loaded_versions(m->name())) r->add_versions(std::to_string(v));
      auto put = [](const TensorInfo& t, inference::ModelMetadataResponse::TensorMetadata* o) {
        o->set_name(t.name);
        o->set_datatype(kserve_type(t.dtype).value_or(std::string(dtype_name(t.dtype))));
        for (int64_t d : t.shape) o->add_shape(d < 0 ? -1 : d);
      };
      for (const TensorInfo& t : m->engine().inputs()) put(t, r->add_inputs());
      for (const TensorInfo& t : m->engine().outputs()) put(t, r->add_outputs());
    });
  }
  grpc::Status ModelConfig(grpc::ServerContext*, const inference::ModelConfigRequest* q,
                           inference::ModelConfigResponse* r) override {
    return guarded([&] { *r->mutable_config() = repo_.find(q->name(), q->version())->config(); });
  }
  grpc::Status ModelInfer(grpc::ServerContext* ctx, const inference::ModelInferRequest* q,
                          inference::ModelInferResponse* r) override {
    return guarded([&] { infer(*ctx, *q, *r); });
  }
  grpc::Status RepositoryIndex(grpc::ServerContext*, const inference::RepositoryIndexRequest* q,
                               inference::RepositoryIndexResponse* r) override {
    for (const auto& e : repo_.index()) {
      for (int64_t v : e.versions) {
        const bool ready = std::find(e.loaded.begin(), e.loaded.end(), v) != e.loaded.end();
        if (q->ready() && !ready) continue;
        auto* m = r->add_models();
        m->set_name(e.name);
        m->set_version(std::to_string(v));
        m->set_state(ready ? "READY" : "UNAVAILABLE");
        if (!ready) m->set_reason(e.reason);
      }
    }
    return grpc::Status::OK;
  }
  grpc::Status RepositoryModelLoad(grpc::ServerContext*, const inference::RepositoryModelLoadRequest* q,
                                   inference::RepositoryModelLoadResponse*) override {
    Status s = repo_.load(q->model_name());
    return s ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, s.message());
  }
  grpc::Status RepositoryModelUnload(grpc::ServerContext*, const inference::RepositoryModelUnloadRequest* q,
                                     inference::RepositoryModelUnloadResponse*) override {
    Status s = repo_.unload(q->model_name());
    return s ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, s.message());
  }

 private:
  void infer(const grpc::ServerContext& ctx, const inference::ModelInferRequest& q, inference::ModelInferResponse& r) {
    std::shared_ptr<LoadedModel> m = repo_.find(q.model_name(), q.model_version());
    CountedRequest counted(*m);
    const auto& infos = m->engine().inputs();
    const bool raw = q.raw_input_contents_size() > 0;
    if (raw && q.raw_input_contents_size() != q.inputs_size()) {
      throw HttpError{400, "the request has " + std::to_string(q.inputs_size()) + " inputs and " +
                               std::to_string(q.raw_input_contents_size()) + " raw_input_contents"};
    }
    std::vector<Input> inputs(infos.size());
    for (int k = 0; k < q.inputs_size(); ++k) {
      const auto& t = q.inputs(k);
      Input& in = bind_input(inputs, infos, t.name(), &t.datatype(), {t.shape().begin(), t.shape().end()});
      if (raw) {
        const std::string& b = q.raw_input_contents(k);
        decode_raw(in, b.data(), b.size(), in.count);
      } else {
        decode_contents(in, t.contents());
      }
    }
    std::vector<TensorView> views;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].info) throw HttpError{400, "input '" + infos[k].name + "' of model '" + m->name() + "' is missing"};
      views.push_back(inputs[k].view());
    }
    uint64_t timeout_us = 0;
    if (auto it = q.parameters().find("timeout"); it != q.parameters().end()) {
      const auto& p = it->second;
      if (p.has_int64_param() && p.int64_param() >= 0) timeout_us = uint64_t(p.int64_param());
      else if (p.has_uint64_param()) timeout_us = p.uint64_param();
      else throw HttpError{400, "parameter 'timeout' is not a count of microseconds"};
    }
    auto out = m->infer(views, timeout_us, steady_deadline(ctx));
    if (!out) throw HttpError{status_of(out.status()), out.status().message()};

    const auto& onfo = m->engine().outputs();
    std::vector<size_t> wanted;
    for (const auto& o : q.outputs()) {
      size_t k = 0;
      while (k < onfo.size() && onfo[k].name != o.name()) ++k;
      if (k == onfo.size()) throw HttpError{400, "unknown output '" + o.name() + "' for model '" + m->name() + "'"};
      wanted.push_back(k);
    }
    if (q.outputs_size() == 0) {
      for (size_t k = 0; k < onfo.size(); ++k) wanted.push_back(k);
    }
    r.set_model_name(m->name());
    r.set_model_version(std::to_string(m->version()));
    r.set_id(q.id());
    for (size_t k : wanted) {
      const HostTensor& t = (*out)[k];
      auto* o = r.add_outputs();
      o->set_name(onfo[k].name);
      o->set_datatype(kserve_type(t.dtype()).value_or("?"));
      for (int64_t d : t.shape()) o->add_shape(d);
      r.add_raw_output_contents(encode_binary(t));
    }
    counted.answered();
  }

  Repository& repo_;
};

}  // namespace

struct GrpcServer::Impl {
  explicit Impl(Repository& r) : service(r) {}
  Service service;
  std::unique_ptr<grpc::Server> server;
};

GrpcServer::GrpcServer(Repository& repo) : impl_(std::make_unique<Impl>(repo)) {}
GrpcServer::~GrpcServer() { stop(); }

bool GrpcServer::start(const std::string& address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&impl_->service);
  // Tensors are large: no 4 MiB limit (the codec bounds what a request may claim).
  b.SetMaxReceiveMessageSize(INT_MAX);
  b.SetMaxSendMessageSize(INT_MAX);
  impl_->server = b.BuildAndStart();
  return impl_->server && port != 0;
}

void GrpcServer::stop() {
  if (impl_->server) {
    impl_->server->Shutdown();  // waits for the calls in flight
    impl_->server->Wait();
    impl_->server.reset();
  }
}

}  // namespace kiln::serve
