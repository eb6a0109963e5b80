#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace mm3 {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw BadModel(fmt::format("{}: {}", path, what));
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(MappedFile::open(path)) {
  const uint64_t size = file_->size();
  if (size < 8) bad(path, fmt::format("truncated: {} bytes, a safetensors file needs at least 8", size));
  const uint64_t n = read_u64_le(file_->data());
  if (n > kMaxHeaderBytes)
    bad(path, fmt::format("header length {} exceeds the 100 MB limit (corrupt or not safetensors)", n));
  if (n > size - 8)
    bad(path, fmt::format("truncated: header claims {} bytes but the file has only {} after the length", n,
                          size - 8));
  data_start_ = 8 + n;
  const uint64_t data_bytes = size - data_start_;

  json h;
  try {
    h = json::parse(file_->data() + 8, file_->data() + 8 + n);
  } catch (const json::exception& e) {
    bad(path, fmt::format("header is not valid JSON ({})", e.what()));
  }
  if (!h.is_object()) bad(path, "header is not a JSON object");

  std::vector<const TensorInfo*> by_offset;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) bad(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m)
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      continue;
    }
    auto where = [&](const std::string& w) { bad(path, fmt::format("tensor '{}': {}", name, w)); };
    if (!v.is_object()) where("entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) where("missing string field 'dtype'");
    if (!v.contains("shape") || !v["shape"].is_array()) where("missing array field 'shape'");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      where("missing field 'data_offsets' [begin, end]");
    TensorInfo ti;
    ti.name = name;
    const std::string ds = v["dtype"].get<std::string>();
    auto dt = dtype_from_name(ds);
    if (!dt) where(fmt::format("unsupported dtype '{}' (expected F32, BF16, F16, I64 or I32)", ds));
    ti.dtype = *dt;
    unsigned __int128 bytes = dtype_size(ti.dtype);
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        where("shape entries must be non-negative integers");
      uint64_t dim = d.get<uint64_t>();
      bytes *= dim;
      if (bytes > (static_cast<unsigned __int128>(1) << 62)) where("shape is absurdly large");
      ti.shape.push_back(static_cast<int64_t>(dim));
    }
    for (const json& o : v["data_offsets"])
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        where("data_offsets must be non-negative integers");
    ti.begin = v["data_offsets"][0].get<uint64_t>();
    ti.end = v["data_offsets"][1].get<uint64_t>();
    if (ti.end < ti.begin) where(fmt::format("data_offsets [{}, {}] are reversed", ti.begin, ti.end));
    if (ti.end > data_bytes)
      where(fmt::format("data_offsets end {} is past the data section ({} bytes): file truncated?", ti.end,
                        data_bytes));
    if (static_cast<unsigned __int128>(ti.end - ti.begin) != bytes)
      where(fmt::format("{} {} needs {} bytes but data_offsets span {}", ds, shape_str(ti.shape),
                        static_cast<uint64_t>(bytes), ti.end - ti.begin));
    auto [pos, ok] = tensors_.emplace(name, std::move(ti));
    if (!ok) where("appears twice");
    by_offset.push_back(&pos->second);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo* a = by_offset[i - 1];
    const TensorInfo* b = by_offset[i];
    if (b->begin < a->end && b->begin != b->end && a->begin != a->end)
      bad(path, fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", a->name, a->begin, a->end,
                            b->name, b->begin, b->end));
  }
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) bad(path(), fmt::format("no tensor named '{}'", name));
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const unsigned char* p = file_->data() + data_start_ + ti.begin;
  const size_t align = dtype_size(ti.dtype);
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    // Misaligned data (legal in the format, rare in practice): copy instead of handing out a view.
    Tensor t = Tensor::empty(ti.dtype, ti.shape);
    std::memcpy(t.raw(), p, ti.end - ti.begin);
    return t;
  }
  return Tensor::borrow(ti.dtype, ti.shape, p, file_);
}

TensorStore TensorStore::open_file(const std::string& path) {
  TensorStore s;
  s.dir_ = fs::path(path).parent_path().string();
  s.files_.push_back(std::make_shared<SafetensorsFile>(path));
  for (const auto& [name, ti] : s.files_[0]->tensors()) s.where_[name] = 0;
  return s;
}

TensorStore TensorStore::open_dir(const std::string& dir) {
  if (!fs::is_directory(dir)) throw BadModel(fmt::format("{}: not a directory", dir));
  std::vector<fs::path> indexes, files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string fn = e.path().filename().string();
    if (fn.size() > 23 && fn.ends_with(".safetensors.index.json")) indexes.push_back(e.path());
    else if (fn.ends_with(".safetensors")) files.push_back(e.path());
  }
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  TensorStore s;
  s.dir_ = dir;
  if (indexes.size() > 1)
    throw BadModel(fmt::format("{}: {} index files; expected at most one *.safetensors.index.json", dir,
                               indexes.size()));
  if (indexes.size() == 1) {
    const std::string ipath = indexes[0].string();
    json idx;
    try {
      std::ifstream in(ipath);
      idx = json::parse(in);
    } catch (const json::exception& e) {
      throw BadModel(fmt::format("{}: not valid JSON ({})", ipath, e.what()));
    }
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw BadModel(fmt::format("{}: missing object 'weight_map'", ipath));
    s.sharded_ = true;
    std::map<std::string, size_t> file_index;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw BadModel(fmt::format("{}: weight_map['{}'] is not a file name", ipath, it.key()));
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw BadModel(fmt::format("{}: weight_map['{}'] = '{}' must be a file in the same folder", ipath,
                                   it.key(), shard));
      auto f = file_index.find(shard);
      if (f == file_index.end()) {
        fs::path sp = fs::path(dir) / shard;
        if (!fs::exists(sp))
          throw BadModel(fmt::format("{}: shard '{}' (for '{}') is missing", ipath, shard, it.key()));
        s.files_.push_back(std::make_shared<SafetensorsFile>(sp.string()));
        f = file_index.emplace(shard, s.files_.size() - 1).first;
      }
      if (!s.files_[f->second]->contains(it.key()))
        throw BadModel(fmt::format("{}: index says '{}' is in {}, but that shard does not hold it", ipath,
                                   it.key(), shard));
      s.where_[it.key()] = f->second;
    }
    for (size_t i = 0; i < s.files_.size(); ++i)
      for (const auto& [name, ti] : s.files_[i]->tensors())
        if (!s.where_.count(name))
          throw BadModel(fmt::format("{}: tensor '{}' is in shard {} but not in the index", ipath, name,
                                     fs::path(s.files_[i]->path()).filename().string()));
    return s;
  }
  if (files.empty()) throw BadModel(fmt::format("{}: no .safetensors files", dir));
  for (const auto& p : files) {
    s.files_.push_back(std::make_shared<SafetensorsFile>(p.string()));
    for (const auto& [name, ti] : s.files_.back()->tensors()) {
      if (s.where_.count(name))
        throw BadModel(fmt::format("{}: tensor '{}' appears in two files", dir, name));
      s.where_[name] = s.files_.size() - 1;
    }
  }
  return s;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> r;
  for (const auto& [n, i] : where_) r.push_back(n);
  return r;
}

const TensorInfo& TensorStore::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw BadModel(fmt::format("{}: no tensor named '{}'", dir_, name));
  return files_[it->second]->info(name);
}

const std::string& TensorStore::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw BadModel(fmt::format("{}: no tensor named '{}'", dir_, name));
  return files_[it->second]->path();
}

Tensor TensorStore::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw BadModel(fmt::format("{}: no tensor named '{}'", dir_, name));
  return files_[it->second]->get(name);
}

uint64_t TensorStore::total_bytes() const {
  uint64_t b = 0;
  for (const auto& [n, i] : where_) {
    const TensorInfo& ti = files_[i]->info(n);
    b += ti.end - ti.begin;
  }
  return b;
}

int64_t TensorStore::total_params() const {
  int64_t p = 0;
  for (const auto& [n, i] : where_) p += shape_numel(files_[i]->info(n).shape);
  return p;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  std::vector<Tensor> cont;
  for (const auto& [name, t] : tensors) {
    cont.push_back(t.contiguous());
    h[name] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8) hs += ' ';
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InvalidInput(fmt::format("cannot write {}", tmp));
    uint64_t n = hs.size();
    unsigned char lb[8];
    for (int i = 0; i < 8; ++i) lb[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(lb), 8);
    out.write(hs.data(), static_cast<std::streamsize>(hs.size()));
    for (const Tensor& t : cont) out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    if (!out) throw InvalidInput(fmt::format("write to {} failed (disk full?)", tmp));
  }
  fs::rename(tmp, path);
}

}  // namespace mm3
