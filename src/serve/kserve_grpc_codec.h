// The KServe v2 gRPC request's tensors without gRPC itself (only its protobuf messages): what
// kserve_grpc.cc answers ModelInfer with, and what the grpc fuzz target feeds hostile messages.
// Errors are HttpErrors naming the input (the server maps them to gRPC status codes).
#pragma once

#include <cstdint>
#include <vector>

#include "grpc_service.pb.h"
#include "serve/kserve_codec.h"

namespace kiln::serve {

// The request's inputs in `infos` order (an input the request does not give has a null info), from
// raw_input_contents (one per input, in order) or each input's typed contents.
std::vector<Input> decode_grpc_inputs(const inference::ModelInferRequest& q, const std::vector<TensorInfo>& infos);
// The shared memory parameters of an input or a requested output (see shm_ref_json).
std::optional<ShmRef> shm_ref_grpc(const google::protobuf::Map<std::string, inference::InferParameter>& params,
                                   const std::string& what);
// The request's "timeout" parameter in microseconds (0: none).
uint64_t grpc_timeout_us(const inference::ModelInferRequest& q);

}  // namespace kiln::serve
