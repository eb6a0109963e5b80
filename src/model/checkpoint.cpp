#include "model/checkpoint.h"

#include <filesystem>

namespace mm3 {

Checkpoint::Checkpoint(std::string dir) : dir_(std::move(dir)), cfg_(load_model_configs(dir_)) {}

std::string Checkpoint::component_dir(const std::string& component) const {
  return (std::filesystem::path(dir_) / component).string();
}

const TensorStore& Checkpoint::store(const std::string& component) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stores_.find(component);
  if (it == stores_.end())
    it = stores_.emplace(component, std::make_shared<TensorStore>(TensorStore::open_dir(component_dir(component))))
             .first;
  return *it->second;
}

void Checkpoint::release(const std::string& component) const {
  std::lock_guard<std::mutex> lock(mu_);
  stores_.erase(component);
}

}  // namespace mm3
