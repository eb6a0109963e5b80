// hf_download.h — downloading a Hugging Face hub repo snapshot into the standard HF cache, the way
// huggingface_hub's snapshot_download does, so python tools and mm3 share one copy:
//
//   {cache}/models--ORG--NAME/blobs/<sha256 of an LFS file | git oid of a regular file>
//   {cache}/models--ORG--NAME/snapshots/<commit>/<path>  -> relative symlink ../../blobs/<id>
//   {cache}/models--ORG--NAME/refs/<revision>             the commit (no newline)
//   {cache}/.locks/models--ORG--NAME/<id>.lock            flock'ed while a blob is fetched
//
// Hub URL scheme (huggingface_hub's): GET {endpoint}/api/models/{repo}/revision/{rev} -> {"sha": commit};
// GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true -> [{"type","path","size","oid",
// "lfs":{"oid","size"}}], paginated by `Link: <url>; rel="next"`; GET {endpoint}/{repo}/resolve/{commit}/{path}
// (usually a 302 to a CDN on another host; `Range: bytes=N-` resumes).
//
// A blob is written to blobs/<id>.incomplete (resumed with Range when it exists; a 200 instead of 206
// restarts it), checked (size, then sha256 for LFS files / git blob sha1 for the others), fsync'ed and
// renamed; only then does its snapshot symlink appear. Cancelling leaves the .incomplete for the next run.
// Every failure is mm3::BadModel with one line saying what happened and how to fix it (Cancelled on cancel).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mm3 {

struct HfDownloadEvent {
  enum class Kind {
    plan,      // once, after listing: `count` files, `bytes` still to fetch (the rest is in the cache)
    progress,  // during one file (throttled to a few per second)
    done,      // one file finished (or was already cached: `cached`)
  };
  Kind kind = Kind::plan;
  std::string path;     // repo-relative file
  size_t index = 0;     // 1-based position of this file among `count`
  size_t count = 0;     // files in the snapshot
  uint64_t done = 0;    // bytes of this file on disk
  uint64_t total = 0;   // bytes of this file
  double rate = 0;      // bytes per second fetched by this run for this file
  uint64_t bytes = 0;   // plan: bytes to fetch over all files
  bool cached = false;  // done: nothing was fetched
};

struct HfDownloadOptions {
  std::string endpoint;   // empty: $HF_ENDPOINT, else https://huggingface.co
  std::string token;      // empty: $HF_TOKEN (sent only to the endpoint's host, never to the CDN)
  std::string cache_dir;  // empty: hf_hub_cache_dir()
  std::string revision = "main";
  // Which repo files to fetch (all when empty).
  std::function<bool(const std::string& path)> include;
  // Paths that must be in the (filtered) listing; a path ending in '/' means "some file in this folder".
  std::vector<std::string> required;
  std::function<void(const HfDownloadEvent&)> on_progress;  // may be empty
  std::function<bool()> should_cancel;                      // may be empty; true -> Cancelled
  // Timeouts in seconds.
  int connect_timeout_s = 20;
  int read_timeout_s = 60;
};

// $HF_ENDPOINT without a trailing '/', else https://huggingface.co.
std::string hf_endpoint();
// $HF_HUB_OFFLINE is 1/true/yes/on (any case).
bool hf_hub_offline();
// ORG/NAME with each part of [A-Za-z0-9._-], not starting with '.', no "..".
bool is_hf_repo_id(const std::string& s);
// {cache}/models--ORG--NAME
std::string hf_repo_cache_dir(const std::string& cache_dir, const std::string& repo_id);

// Fetches what is missing of `repo_id` at `opt.revision` and returns the snapshot folder
// ({cache}/models--ORG--NAME/snapshots/<commit>). Files are linked in listing order except that
// the files named in `last` (e.g. modular_model_index.json) are linked after all the others, so their
// presence marks a complete snapshot.
std::string hf_download_snapshot(const std::string& repo_id, const HfDownloadOptions& opt,
                                 const std::vector<std::string>& last = {});

// Lowercase hex digests (OpenSSL EVP): SHA-256 of bytes / of a file; git's blob id (SHA-1 of
// "blob <size>\0" + bytes).
std::string sha256_hex(const std::string& bytes);
std::string sha256_file_hex(const std::string& path);
std::string git_blob_sha1_hex(const std::string& bytes);

}  // namespace mm3
