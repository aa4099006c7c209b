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
Clock::time_point steady_deadline(const grpc::ServerContextBase& ctx) {
  const auto left = ctx.deadline() - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

// One ModelInfer call on gRPC's callback API: decoded and submitted to the model's scheduler on the
// gRPC thread that received it, which returns at once (unless the request runs there: alone, a session
// idle); answered (encoded, Finish) by one of the scheduler's answer threads, or by the thread that
// ran it. On the H200 at 64 clients this answered 8-13% more calls a second than the synchronous API
// (a thread blocked per call in flight); answered by the worker that ran the batch, 11% fewer
// (bench/RESULTS.md, fortieth session).
class InferCall final : public grpc::ServerUnaryReactor {
 public:
  InferCall(Repository& repo, SharedMemory& shm, grpc::CallbackServerContext& ctx, const inference::ModelInferRequest& q,
            inference::ModelInferResponse& r)
      : repo_(repo), shm_(shm), ctx_(ctx), q_(q), r_(r) {}

  void start() {
    // The model is held here only: once submitted, the scheduler is not destroyed before it has
    // answered (an unload waits), and the answer must not drop the last reference on the thread that
    // runs it (a worker of that scheduler).
    std::shared_ptr<LoadedModel> m;
    grpc::Status refused = guarded([&] {
      m = repo_.find(q_.model_name(), q_.model_version());
      model_ = m.get();
      counted_.emplace(*m);
      decode();
      m->submit(views_, grpc_timeout_us(q_), steady_deadline(ctx_), &targets_,
                [this](Expected<std::vector<HostTensor>> out, int status) { complete(std::move(out), status); });
    });
    if (!refused.ok()) {  // nothing submitted: answered here
      counted_.reset();
      Finish(refused);
    }
  }
  void OnDone() override { delete this; }

 private:
  void decode() {
    const auto& infos = model_->engine().inputs();
    inputs_ = decode_grpc_inputs(q_, infos);
    shm_.attach(inputs_);
    for (size_t k = 0; k < inputs_.size(); ++k) {
      if (!inputs_[k].info) {
        throw HttpError{400, "input '" + infos[k].name + "' of model '" + model_->name() + "' is missing"};
      }
      views_.push_back(inputs_[k].view());
    }
    const auto& onfo = model_->engine().outputs();
    for (const auto& o : q_.outputs()) {  // output index, a region to write it into
      size_t k = 0;
      while (k < onfo.size() && onfo[k].name != o.name()) ++k;
      if (k == onfo.size()) throw HttpError{400, "unknown output '" + o.name() + "' for model '" + model_->name() + "'"};
      for (const auto& w : wanted_) {
        if (w.first == k) throw HttpError{400, "output '" + o.name() + "' is requested twice"};
      }
      wanted_.emplace_back(k, shm_ref_grpc(o.parameters(), "output '" + o.name() + "'"));
    }
    if (q_.outputs_size() == 0) {
      for (size_t k = 0; k < onfo.size(); ++k) wanted_.emplace_back(k, std::nullopt);
    }
    // Outputs that name a region are written there by the thread that runs the request.
    std::vector<std::pair<size_t, const ShmRef*>> in_shm;
    for (const auto& [k, ref] : wanted_) in_shm.emplace_back(k, ref ? &*ref : nullptr);
    targets_ = shm_.targets(in_shm, onfo, keep_);
  }

  // The scheduler's answer, on the thread that ran the batch (or the timer's, or start()'s).
  void complete(Expected<std::vector<HostTensor>> out, int status) {
    grpc::Status s = guarded([&] {
      if (!out) throw HttpError{status, out.status().message()};
      encode(*out);
      counted_->answered();
    });
    counted_.reset();  // counted before the client has its answer
    Finish(s);
  }

  void encode(const std::vector<HostTensor>& out) {
    const auto& onfo = model_->engine().outputs();
    r_.set_model_name(model_->name());
    r_.set_model_version(std::to_string(model_->version()));
    r_.set_id(q_.id());
    for (const auto& [k, ref] : wanted_) {
      const HostTensor& t = out[k];
      auto* o = r_.add_outputs();
      o->set_name(onfo[k].name);
      o->set_datatype(kserve_type(t.dtype()).value_or("?"));
      for (int64_t d : t.shape()) o->add_shape(d);
      if (!ref) {
        r_.add_raw_output_contents(encode_binary(t));
        continue;
      }
      // In the region; an empty raw entry keeps raw_output_contents in step with outputs.
      const uint64_t written = shm_.written(*ref, targets_[k], t, onfo[k].name);
      auto& p = *o->mutable_parameters();
      p["shared_memory_region"].set_string_param(ref->region);
      p["shared_memory_byte_size"].set_int64_param(int64_t(written));
      if (ref->offset) p["shared_memory_offset"].set_int64_param(int64_t(ref->offset));
      r_.add_raw_output_contents();
    }
  }

  Repository& repo_;
  SharedMemory& shm_;
  grpc::CallbackServerContext& ctx_;
  const inference::ModelInferRequest& q_;
  inference::ModelInferResponse& r_;
  LoadedModel* model_ = nullptr;
  std::optional<CountedRequest> counted_;
  std::vector<Input> inputs_;
  std::vector<TensorView> views_;
  std::vector<std::pair<size_t, std::optional<ShmRef>>> wanted_;
  std::vector<std::shared_ptr<const void>> keep_;
  std::vector<OutputTarget> targets_;
};

// ModelInfer on the callback API (InferCall), every other method synchronous.
class Service final : public inference::GRPCInferenceService::WithCallbackMethod_ModelInfer<
                          inference::GRPCInferenceService::Service> {
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
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* ctx, const inference::ModelInferRequest* q,
                                       inference::ModelInferResponse* r) override {
    auto* call = new InferCall(repo_, shm_, *ctx, *q, *r);
    call->start();  // may be answered (Finish) before it returns
    return call;
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
  // The synchronous methods (all but ModelInfer): one completion queue with up to 64 threads polling
  // it, as measured for the synchronous ModelInfer before it moved to the callback API (gRPC's
  // default of 2 pollers ended a thread per answer under load; bench/RESULTS.md, thirty-eighth
  // session). These options do not reach the callback handlers: gRPC runs them on threads of its
  // own, which a request run inline (Scheduler::submit) holds for its run.
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
