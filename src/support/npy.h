// NumPy .npy files (format versions 1.0, 2.0 and 3.0) <-> Tensor, for `kiln run` and
// `kiln compare`. Little-endian, C order; numpy's bool, int/uint 8-64, float16/32/64 and
// fixed-width unicode ('<U') strings. bfloat16 and float8 have no numpy dtype: they are written
// as float32 (a note says so in the CLI). Every header field is checked before anything is
// allocated, so a corrupt file is an error that names the file, never a crash or a huge allocation.
//
//   KILN_ASSIGN_OR_RETURN(Tensor x, read_npy("input.npy"));
//   KILN_RETURN_IF_ERROR(write_npy("out/logits.npy", y));
#pragma once

#include <string>

#include "ir/tensor.h"

namespace kiln {

Expected<Tensor> read_npy(const std::string& path);
Expected<Tensor> parse_npy(const std::string& bytes, const std::string& what);
// Writes via a temporary file and rename, so a failed write never leaves a truncated file.
Status write_npy(const std::string& path, const Tensor& t);
std::string serialize_npy(const Tensor& t);
// The file stem a tensor named `name` is read from or written to (NAME.npy): characters outside
// [A-Za-z0-9._-] become '_', and ".", ".." and "" get a leading '_'.
std::string npy_file_stem(const std::string& name);

}  // namespace kiln
