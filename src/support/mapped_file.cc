#include "support/mapped_file.h"

#include <cstdio>
#include <fstream>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace kiln {

MappedFile::~MappedFile() {
  if (p) munmap(p, size);
}

Expected<std::shared_ptr<const MappedFile>> map_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return KILN_ERROR(kIo, "{}: is a directory, not a file", path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return KILN_ERROR(kIo, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  auto m = std::make_shared<MappedFile>();
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return KILN_ERROR(kIo, "{}: cannot read: {}", path, std::strerror(errno));
  }
  m->size = size_t(st.st_size);
  if (m->size > 0) {
    void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return KILN_ERROR(kIo, "{}: cannot map: {}", path, std::strerror(errno));
    }
    m->p = p;
    ::madvise(p, m->size, MADV_SEQUENTIAL | MADV_WILLNEED);
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(m));
}

Status write_file_atomic(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return KILN_ERROR(kIo, "{}: cannot write: {}", path, std::strerror(errno));
    f.write(bytes.data(), std::streamsize(bytes.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return KILN_ERROR(kIo, "{}: write failed (disk full?)", path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return KILN_ERROR(kIo, "{}: cannot move into place: {}", path, std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace kiln
