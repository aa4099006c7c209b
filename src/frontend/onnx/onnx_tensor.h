// TensorProto <-> Tensor, with external data resolved inside the model's folder only.
#pragma once

#include <memory>
#include <string>

#include "ir/tensor.h"
#include "onnx/onnx-data.pb.h"
#include "onnx/onnx-ml.pb.h"

namespace kiln::onnx_io {

struct TensorReadOptions {
  // Folder that external data paths are relative to; empty: external data is refused.
  std::string base_dir;
  // What keeps the parsed protobuf alive: when set, large raw_data tensors view the protobuf's
  // bytes instead of being copied (a 400 MB model is otherwise copied and zero-filled again).
  std::shared_ptr<const void> owner;
};

// Converts a TensorProto; `what` names it in errors ("initializer 'w'").
Expected<Tensor> tensor_from_proto(const onnx::TensorProto& p, const TensorReadOptions& opt,
                                   const std::string& what);
// Converts a SequenceProto / OptionalProto / TensorProto (as in the backend test data) to Data.
Expected<Data> data_from_sequence(const onnx::SequenceProto& p, const std::string& what);
Expected<Data> data_from_optional(const onnx::OptionalProto& p, const std::string& what);

// Writes a tensor as a TensorProto (raw_data; strings in string_data).
void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p);

}  // namespace kiln::onnx_io
