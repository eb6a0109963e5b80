// core_test_util.h — small helpers shared by the core tests: temp dirs and raw file writing.
#pragma once

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace mm3::test {

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("mm3_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A raw safetensors file: u64 header length + header text + data bytes.
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s + header + data;
}

inline std::filesystem::path golden_dir() { return std::filesystem::path(MM3_GOLDEN_DIR); }
inline bool have_golden() { return std::filesystem::exists(golden_dir() / "manifest.json"); }

}  // namespace mm3::test
