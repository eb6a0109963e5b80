// mmap_file.h — a read-only memory map of a whole file, shared by the tensors that borrow from it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace mm3 {

class MappedFile {
 public:
  // Throws BadModel (naming the path and the OS error) when the file cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace mm3
