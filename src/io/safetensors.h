// safetensors.h — zero-copy reader of .safetensors files and sharded checkpoints.
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]},
// "__metadata__": {...}}, then the data buffer; offsets are relative to the buffer. Every header is
// validated before any tensor is handed out: size limits (header <= 100 MB), known dtypes, shapes whose
// byte size equals e - b, offsets inside the file, no two tensors overlapping. A defect is a BadModel
// error that names the file and the tensor; never undefined behaviour.
//
// A sharded checkpoint (`*.safetensors.index.json` with a `weight_map`) is presented as one store.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mmap_file.h"

namespace mm3 {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

  // Maps and validates; throws BadModel with the path and the defect.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint64_t file_bytes() const { return file_->size(); }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws BadModel when absent

  // Zero-copy view (copied only if the data is misaligned for its dtype).
  Tensor get(const std::string& name) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of one component: a single .safetensors file, or the shards an index names.
class TensorStore {
 public:
  // `dir` holds either exactly one `*.safetensors.index.json` (sharded) or `*.safetensors` files.
  static TensorStore open_dir(const std::string& dir);
  static TensorStore open_file(const std::string& path);

  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  Tensor get(const std::string& name) const;
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  uint64_t total_bytes() const;    // sum of tensor data bytes
  int64_t total_params() const;    // sum of numel

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes tensors (contiguous copies) to a .safetensors file; used by tests and synth-checkpoint.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mm3
