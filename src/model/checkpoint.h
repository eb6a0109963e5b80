// checkpoint.h — a MiniMax-Music3 checkpoint folder in the diffusers componentized layout
// (MODEL.md §1.1): validated configs up front, each component's tensors opened (mmap) on first use.
// Immutable after construction apart from the lazily filled store cache; safe to share across threads.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "io/safetensors.h"
#include "model/config.h"

namespace mm3 {

class Checkpoint {
 public:
  explicit Checkpoint(std::string dir);  // throws BadModel naming the file/field at fault

  const std::string& dir() const { return dir_; }
  const ModelConfigs& configs() const { return cfg_; }
  std::string component_dir(const std::string& component) const;
  // The component's tensors (opened and validated on first call).
  const TensorStore& store(const std::string& component) const;
  // Drops the cached store (its mmaps close once no tensor view of it is alive). Models holding views
  // keep their own references, so this is safe at any time.
  void release(const std::string& component) const;

 private:
  std::string dir_;
  ModelConfigs cfg_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::shared_ptr<TensorStore>> stores_;
};

}  // namespace mm3
