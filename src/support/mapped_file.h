// A file mapped read-only: its pages come from the page cache with no copy, for as long as the
// mapping lives (engine files' weights and ONNX models are read in place through it).
//
//   KILN_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> m, map_file("model.onnx"));
//   std::string_view bytes = m->view();
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "support/status.h"

namespace kiln {

struct MappedFile {
  void* p = nullptr;
  size_t size = 0;
  std::string_view view() const { return {static_cast<const char*>(p), size}; }
  ~MappedFile();
};

// Errors name the path: a directory, a file that cannot be opened or mapped.
Expected<std::shared_ptr<const MappedFile>> map_file(const std::string& path);

// Writes `bytes` to path through a temporary file renamed into place: a failed write leaves no
// file (and an older one untouched). Errors name the path.
Status write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace kiln
