#include "serve/kserve_grpc.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <optional>

#include "grpc_service.grpc.pb.h"
#include "model_config.pb.h"
#include "serve/kserve_codec.h"
#include "serve/kserve_grpc_codec.h"

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

// The client's deadline on the steady clock (max when it set none or one past a day).
Clock::time_point steady_deadline(const grpc::ServerContext& ctx) {
  const auto left = ctx.deadline() - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

class Service final : public inference::GRPCInferenceService::Service {
 public:
  Service(Repository& r, SharedMemory& shm) : repo_(r), shm_(shm) {}

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
    for (const char* e : {"binary_tensor_data", "model_repository", "model_configuration", "system_shared_memory"}) {
      r->add_extensions(e);
    }
    if (cuda_shared_memory_supported()) r->add_extensions("cuda_shared_memory");
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

  grpc::Status SystemSharedMemoryStatus(grpc::ServerContext*, const inference::SystemSharedMemoryStatusRequest* q,
                                        inference::SystemSharedMemoryStatusResponse* r) override {
    return guarded([&] {
      for (const auto& st : shm_.status(SharedMemory::Kind::kSystem, q->name())) {
        auto& o = (*r->mutable_regions())[st.name];
        o.set_name(st.name);
        o.set_key(st.key);
        o.set_offset(st.offset);
        o.set_byte_size(st.byte_size);
      }
    });
  }
  grpc::Status SystemSharedMemoryRegister(grpc::ServerContext*, const inference::SystemSharedMemoryRegisterRequest* q,
                                          inference::SystemSharedMemoryRegisterResponse*) override {
    return guarded([&] { shm_.register_system(q->name(), q->key(), q->offset(), q->byte_size()); });
  }
  grpc::Status SystemSharedMemoryUnregister(grpc::ServerContext*, const inference::SystemSharedMemoryUnregisterRequest* q,
                                            inference::SystemSharedMemoryUnregisterResponse*) override {
    return guarded([&] { shm_.unregister(SharedMemory::Kind::kSystem, q->name()); });
  }
  grpc::Status CudaSharedMemoryStatus(grpc::ServerContext*, const inference::CudaSharedMemoryStatusRequest* q,
                                      inference::CudaSharedMemoryStatusResponse* r) override {
    return guarded([&] {
      for (const auto& st : shm_.status(SharedMemory::Kind::kCuda, q->name())) {
        auto& o = (*r->mutable_regions())[st.name];
        o.set_name(st.name);
        o.set_device_id(uint64_t(st.device_id));
        o.set_byte_size(st.byte_size);
      }
    });
  }
  grpc::Status CudaSharedMemoryRegister(grpc::ServerContext*, const inference::CudaSharedMemoryRegisterRequest* q,
                                        inference::CudaSharedMemoryRegisterResponse*) override {
    return guarded([&] { shm_.register_cuda(q->name(), q->raw_handle(), q->device_id(), q->byte_size()); });
  }
  grpc::Status CudaSharedMemoryUnregister(grpc::ServerContext*, const inference::CudaSharedMemoryUnregisterRequest* q,
                                          inference::CudaSharedMemoryUnregisterResponse*) override {
    return guarded([&] { shm_.unregister(SharedMemory::Kind::kCuda, q->name()); });
  }

 private:
  void infer(const grpc::ServerContext& ctx, const inference::ModelInferRequest& q, inference::ModelInferResponse& r) {
    std::shared_ptr<LoadedModel> m = repo_.find(q.model_name(), q.model_version());
    CountedRequest counted(*m);
    const auto& infos = m->engine().inputs();
    std::vector<Input> inputs = decode_grpc_inputs(q, infos);
    shm_.attach(inputs);
    std::vector<TensorView> views;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].info) throw HttpError{400, "input '" + infos[k].name + "' of model '" + m->name() + "' is missing"};
      views.push_back(inputs[k].view());
    }
    const uint64_t timeout_us = grpc_timeout_us(q);
    const auto& onfo = m->engine().outputs();
    std::vector<std::pair<size_t, std::optional<ShmRef>>> wanted;  // output index, a region to write it into
    for (const auto& o : q.outputs()) {
      size_t k = 0;
      while (k < onfo.size() && onfo[k].name != o.name()) ++k;
      if (k == onfo.size()) throw HttpError{400, "unknown output '" + o.name() + "' for model '" + m->name() + "'"};
      for (const auto& w : wanted) {
        if (w.first == k) throw HttpError{400, "output '" + o.name() + "' is requested twice"};
      }
      wanted.emplace_back(k, shm_ref_grpc(o.parameters(), "output '" + o.name() + "'"));
    }
    if (q.outputs_size() == 0) {
      for (size_t k = 0; k < onfo.size(); ++k) wanted.emplace_back(k, std::nullopt);
    }
    // Outputs that name a region are written there by the worker that runs the request.
    std::vector<std::pair<size_t, const ShmRef*>> in_shm;
    for (const auto& [k, ref] : wanted) in_shm.emplace_back(k, ref ? &*ref : nullptr);
    std::vector<std::shared_ptr<const void>> keep;
    const std::vector<OutputTarget> targets = shm_.targets(in_shm, onfo, keep);
    auto out = m->infer(views, timeout_us, steady_deadline(ctx), &targets);
    if (!out) throw HttpError{status_of(out.status()), out.status().message()};
    r.set_model_name(m->name());
    r.set_model_version(std::to_string(m->version()));
    r.set_id(q.id());
    for (const auto& [k, ref] : wanted) {
      const HostTensor& t = (*out)[k];
      auto* o = r.add_outputs();
      o->set_name(onfo[k].name);
      o->set_datatype(kserve_type(t.dtype()).value_or("?"));
      for (int64_t d : t.shape()) o->add_shape(d);
      if (!ref) {
        r.add_raw_output_contents(encode_binary(t));
        continue;
      }
      // In the region; an empty raw entry keeps raw_output_contents in step with outputs.
      const uint64_t written = shm_.written(*ref, targets[k], t, onfo[k].name);
      auto& p = *o->mutable_parameters();
      p["shared_memory_region"].set_string_param(ref->region);
      p["shared_memory_byte_size"].set_int64_param(int64_t(written));
      if (ref->offset) p["shared_memory_offset"].set_int64_param(int64_t(ref->offset));
      r.add_raw_output_contents();
    }
    counted.answered();
  }

  Repository& repo_;
  SharedMemory& shm_;
};

}  // namespace

struct GrpcServer::Impl {
  Impl(Repository& r, SharedMemory& shm) : service(r, shm) {}
  Service service;
  std::unique_ptr<grpc::Server> server;
};

GrpcServer::GrpcServer(Repository& repo, SharedMemory& shm) : impl_(std::make_unique<Impl>(repo, shm)) {}
GrpcServer::~GrpcServer() { stop(); }

bool GrpcServer::start(const std::string& address) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&impl_->service);
  // Tensors are large: no 4 MiB limit (the codec bounds what a request may claim).
  b.SetMaxReceiveMessageSize(INT_MAX);
  b.SetMaxSendMessageSize(INT_MAX);
  // One completion queue with up to 64 threads polling it. A thread that answered a call polls
  // again unless 64 already do, in which case it exits: a batch's requests are answered together,
  // and gRPC's default of 2 ended a thread per answer under load and started one per new request.
  // A queue per core answered fewer calls a second at 64 clients; with 2 pollers each it answered a
  // lone client sooner (bench/RESULTS.md, thirty-eighth session).
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 64);
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
