// pipeline_hf_download_test.cpp — the hub downloader (src/pipeline/hf_download.h) and resolve_model's
// download on first use, against a local hub: two httplib servers on 127.0.0.1, the "hub" (revision and
// paginated tree APIs, resolve URLs) and a "CDN" on another port that its resolve URLs 302 to, with
// Range support and fault knobs (a corrupted file, a transfer cut in half, Range ignored, a gated repo).
// Never touches the internet: HF_ENDPOINT points at the local hub, HF_HUB_CACHE at a temp folder.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "core/errors.h"
#include "model/checkpoint.h"
#include "pipeline/hf_download.h"
#include "pipeline/model_resolve.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCommit = "0123456789abcdef0123456789abcdef01234567";
constexpr const char* kToken = "hf_test_token";

struct HubFile {
  std::string path, content;
  bool lfs = false;
  uint64_t listed_size = 0;  // 0: the content's size (a lie tests the disk-space check)
};

struct Seen {
  std::string server;  // "hub" | "cdn"
  std::string path;    // decoded path
  std::string range;   // Range header
  std::string auth;    // Authorization header
  int status = 0;
};

std::string blob_id(const HubFile& f) { return f.lfs ? sha256_hex(f.content) : git_blob_sha1_hex(f.content); }

// The local hub. Files are served from memory; everything it saw is in seen().
class FakeHub {
 public:
  FakeHub(std::string repo, std::vector<HubFile> files, size_t page_size)
      : repo_(std::move(repo)), files_(std::move(files)), page_size_(page_size) {
    for (const auto& f : files_) by_blob_[blob_id(f)] = &f;
    hub_port_ = hub_.bind_to_any_port("127.0.0.1");
    cdn_port_ = cdn_.bind_to_any_port("127.0.0.1");
    routes();
    hub_thread_ = std::thread([this] { hub_.listen_after_bind(); });
    cdn_thread_ = std::thread([this] { cdn_.listen_after_bind(); });
    while (!hub_.is_running() || !cdn_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    hub_.stop();
    cdn_.stop();
    hub_thread_.join();
    cdn_thread_.join();
  }

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(hub_port_); }

  // Knobs.
  std::set<std::string> corrupt;       // served with one byte flipped
  std::set<std::string> cut_once;      // the next full transfer stops after half the bytes
  std::set<std::string> ignore_range;  // a Range request gets the whole file with 200
  bool gated = false;                  // 401 on everything, like a gated repo without a token

  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> l(mu_);
    return seen_;
  }
  void clear_seen() {
    std::lock_guard<std::mutex> l(mu_);
    seen_.clear();
  }
  std::vector<Seen> file_requests() {  // downloads of file bodies (the CDN, and the hub's raw route)
    std::vector<Seen> r;
    for (const auto& s : seen())
      if (s.path.rfind("/cdn/", 0) == 0 || s.path.rfind("/raw/", 0) == 0) r.push_back(s);
    return r;
  }

 private:
  void log(const char* server, const httplib::Request& req, int status) {
    std::lock_guard<std::mutex> l(mu_);
    seen_.push_back({server, req.path, req.get_header_value("Range"), req.get_header_value("Authorization"), status});
  }

  void not_found(const char* server, const httplib::Request& req, httplib::Response& res, const char* code) {
    res.status = 404;
    res.set_header("X-Error-Code", code);
    res.set_content(R"({"error":"not found"})", "application/json");
    log(server, req, 404);
  }

  bool refuse(const char* server, const httplib::Request& req, httplib::Response& res) {
    if (!gated) return false;
    res.status = 401;
    res.set_header("X-Error-Code", "GatedRepo");
    res.set_header("X-Error-Message", "Access to this model is restricted.");
    res.set_content(R"({"error":"gated"})", "application/json");
    log(server, req, 401);
    return true;
  }

  void serve_body(const char* server, const HubFile& f, const httplib::Request& req, httplib::Response& res) {
    std::string body = f.content;
    std::string path = f.path;
    bool cut = false, whole = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (corrupt.count(path) && !body.empty()) body[body.size() / 2] ^= 0x5a;
      if (req.get_header_value("Range").empty() && cut_once.count(path)) cut = true, cut_once.erase(path);
      whole = ignore_range.count(path) > 0;
    }
    // httplib applies a request's Range to the content provider itself (206 + Content-Range); a server
    // that ignores Range is simulated by dropping the parsed ranges (the handler's request is the
    // server's own mutable object).
    if (whole) const_cast<httplib::Request&>(req).ranges.clear();
    auto data = std::make_shared<std::string>(std::move(body));
    const size_t half = data->size() / 2;
    res.set_content_provider(data->size(), "application/octet-stream",
                             [data, cut, half](size_t off, size_t len, httplib::DataSink& sink) {
                               if (cut && off >= half) return false;  // the connection drops
                               size_t n = std::min<size_t>(len, 64 << 10);
                               if (cut) n = std::min(n, half - off);
                               sink.write(data->data() + off, n);
                               return true;
                             });
    log(server, req, req.ranges.empty() ? 200 : 206);
  }

  void routes() {
    const std::string org_name = R"(([A-Za-z0-9._-]+/[A-Za-z0-9._-]+))";
    hub_.Get("/api/models/" + org_name + "/revision/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (refuse("hub", req, res)) return;
      if (req.matches[1] != repo_) return not_found("hub", req, res, "RepoNotFound");
      if (req.matches[2] != "main" && req.matches[2] != kCommit) return not_found("hub", req, res, "RevisionNotFound");
      res.set_content(nlohmann::json{{"id", repo_}, {"sha", kCommit}}.dump(), "application/json");
      log("hub", req, 200);
    });
    hub_.Get("/api/models/" + org_name + "/tree/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (refuse("hub", req, res)) return;
      if (req.matches[1] != repo_) return not_found("hub", req, res, "RepoNotFound");
      if (req.matches[2] != kCommit) return not_found("hub", req, res, "RevisionNotFound");
      EXPECT_EQ(req.get_param_value("recursive"), "true");
      // The listing: folders and files, like the hub's recursive tree.
      nlohmann::json all = nlohmann::json::array();
      std::set<std::string> dirs;
      for (const auto& f : files_)
        for (size_t s = f.path.find('/'); s != std::string::npos; s = f.path.find('/', s + 1))
          if (dirs.insert(f.path.substr(0, s)).second)
            all.push_back({{"type", "directory"},
                           {"path", f.path.substr(0, s)},
                           {"size", 0},
                           {"oid", "1111111111111111111111111111111111111111"}});
      for (const auto& f : files_) {
        const uint64_t size = f.listed_size ? f.listed_size : f.content.size();
        nlohmann::json e = {{"type", "file"}, {"path", f.path}, {"size", size}};
        if (f.lfs) {
          e["oid"] = "2222222222222222222222222222222222222222";  // the pointer file's git oid
          e["lfs"] = {{"oid", sha256_hex(f.content)}, {"size", size}, {"pointerSize", 134}};
        } else {
          e["oid"] = git_blob_sha1_hex(f.content);
        }
        all.push_back(e);
      }
      const size_t cursor = req.has_param("cursor") ? std::stoul(req.get_param_value("cursor")) : 0;
      nlohmann::json page = nlohmann::json::array();
      for (size_t i = cursor; i < all.size() && i < cursor + page_size_; ++i) page.push_back(all[i]);
      if (cursor + page_size_ < all.size())
        res.set_header("Link", "<" + endpoint() + "/api/models/" + repo_ + "/tree/" + kCommit +
                                   "?recursive=true&cursor=" + std::to_string(cursor + page_size_) + ">; rel=\"next\"");
      res.set_content(page.dump(), "application/json");
      log("hub", req, 200);
    });
    // resolve: LFS files 302 to the CDN (absolute URL, another port), regular files 307 to a relative
    // path on the hub (the hub's /api/resolve-cache shape).
    hub_.Get("/" + org_name + "/resolve/([^/]+)/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
      if (refuse("hub", req, res)) return;
      if (req.matches[1] != repo_) return not_found("hub", req, res, "RepoNotFound");
      if (req.matches[2] != kCommit) return not_found("hub", req, res, "RevisionNotFound");
      const std::string path = req.matches[3];
      const auto it = std::find_if(files_.begin(), files_.end(), [&](const HubFile& f) { return f.path == path; });
      if (it == files_.end()) return not_found("hub", req, res, "EntryNotFound");
      if (it->lfs) {
        res.set_redirect("http://127.0.0.1:" + std::to_string(cdn_port_) + "/cdn/" + blob_id(*it) + "?sig=x", 302);
      } else {
        // Top-level files get a path-relative Location (from /ORG/NAME/resolve/<commit>/), nested ones a
        // host-relative one.
        if (path.find('/') == std::string::npos)
          res.set_redirect("../../../../raw/" + blob_id(*it), 307);
        else
          res.set_redirect("/raw/" + blob_id(*it), 307);
      }
      log("hub", req, res.status);
    });
    hub_.Get("/raw/([0-9a-f]+)", [this](const httplib::Request& req, httplib::Response& res) {
      const auto it = by_blob_.find(req.matches[1]);
      if (it == by_blob_.end()) return not_found("hub", req, res, "EntryNotFound");
      serve_body("hub", *it->second, req, res);
    });
    cdn_.Get("/cdn/([0-9a-f]+)", [this](const httplib::Request& req, httplib::Response& res) {
      const auto it = by_blob_.find(req.matches[1]);
      if (it == by_blob_.end()) return not_found("cdn", req, res, "EntryNotFound");
      serve_body("cdn", *it->second, req, res);
    });
  }

  std::string repo_;
  std::vector<HubFile> files_;
  size_t page_size_;
  std::map<std::string, const HubFile*> by_blob_;
  httplib::Server hub_, cdn_;
  int hub_port_ = 0, cdn_port_ = 0;
  std::thread hub_thread_, cdn_thread_;
  std::mutex mu_;
  std::vector<Seen> seen_;
};

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(g() & 0xff);
  return s;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A small repo: the index, one file per component folder (so resolve_model's checks pass), a nested
// file two folders deep, two paths with one content (one blob), and the legacy layout.
std::vector<HubFile> small_repo() {
  std::vector<HubFile> f = {
      {"modular_model_index.json", R"({"_class_name": "MiniMaxMusic3Pipeline"})", false},
      {"README.md", "# test model\n", false},
      {"docs/README.md", "# test model\n", false},  // same content as README.md: one blob
      {"assets/examples/prompt.txt", "Genre: pop\n", false},
      {"transformer/diffusion_pytorch_model.safetensors", random_bytes(3 << 20, 1), true},
      {"vocoder/diffusion_pytorch_model.safetensors", random_bytes(200000, 2), true},
      {"qwen_7B/qwen_7B/config.json", "{}", false},
      {"qwen_7B/qwen_7B/model.safetensors", random_bytes(1000, 3), true},
      {"flowmatching_vae.pth", random_bytes(1000, 4), true},
      {"dav.pth", random_bytes(1000, 5), true},
  };
  for (const char* c :
       {"language_model", "rvq_depth_decoder", "condition_encoder", "transformer", "vocoder", "scheduler", "tokenizer"})
    f.push_back({std::string(c) + "/config.json", fmt::format(R"({{"component": "{}"}})", c), false});
  return f;
}

const HubFile& find(const std::vector<HubFile>& files, const std::string& path) {
  for (const auto& f : files)
    if (f.path == path) return f;
  throw std::runtime_error("no file " + path);
}

class HfDownload : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mm3_hf_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    cache_ = tmp_ / "hub";
    for (const char* v : {"HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN_PATH",
                          "HUGGING_FACE_HUB_TOKEN"}) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      ::unsetenv(v);
    }
    ::setenv("HF_HUB_CACHE", cache_.c_str(), 1);
    ::setenv("HF_TOKEN", kToken, 1);
    ::setenv("HF_TOKEN_PATH", (tmp_ / "no-token-file").c_str(), 1);
  }
  void TearDown() override {
    for (const char* v : {"HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_HOME", "HF_TOKEN_PATH",
                          "HUGGING_FACE_HUB_TOKEN"})
      ::unsetenv(v);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  void use(FakeHub& hub) { ::setenv("HF_ENDPOINT", hub.endpoint().c_str(), 1); }

  fs::path repo_dir(const std::string& repo = "test-org/test-model") const { return hf_repo_cache_dir(cache_, repo); }
  fs::path snapshot() const { return repo_dir() / "snapshots" / kCommit; }

  // resolve_model's selection, through the downloader.
  HfDownloadOptions mm3_options() const {
    HfDownloadOptions o;
    o.include = mm3_wants_repo_file;
    return o;
  }

  template <class E>
  std::string expect_throw(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const E& e) {
      return e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong exception: " << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no exception";
    return "";
  }

  fs::path tmp_, cache_;
  std::map<std::string, std::string> saved_;
};

TEST(HfDigest, KnownVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // `printf 'hello\n' | git hash-object --stdin`
  EXPECT_EQ(git_blob_sha1_hex("hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
  EXPECT_EQ(git_blob_sha1_hex(""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
}

TEST(HfRepoId, Validation) {
  EXPECT_TRUE(is_hf_repo_id("MiniMaxAI/MiniMax-Music3"));
  EXPECT_TRUE(is_hf_repo_id("a.b_c/d-e.f"));
  for (const char* bad : {"noslash", "a/b/c", "/abs", "a/", "../x", "a/..", "a/.hidden", "a b/c", "a/b?c"})
    EXPECT_FALSE(is_hf_repo_id(bad)) << bad;
  EXPECT_TRUE(mm3_wants_repo_file("transformer/config.json"));
  EXPECT_FALSE(mm3_wants_repo_file("qwen_7B/qwen_7B/config.json"));
  EXPECT_FALSE(mm3_wants_repo_file("dav.pth"));
}

TEST_F(HfDownload, WritesTheHfCacheLayout) {
  const auto files = small_repo();
  FakeHub hub("test-org/test-model", files, 4);  // 4 entries a page: several pages
  use(hub);
  std::vector<HfDownloadEvent> events;
  HfDownloadOptions o = mm3_options();
  o.on_progress = [&](const HfDownloadEvent& e) { events.push_back(e); };
  const std::string dir = hf_download_snapshot("test-org/test-model", o, {"modular_model_index.json"});
  EXPECT_EQ(fs::path(dir), snapshot());

  // refs/main holds the commit, as huggingface_hub writes it (no newline).
  EXPECT_EQ(read_file(repo_dir() / "refs" / "main"), kCommit);
  size_t wanted = 0;
  for (const auto& f : files) {
    const fs::path link = snapshot() / f.path;
    if (!mm3_wants_repo_file(f.path)) {
      EXPECT_FALSE(fs::exists(fs::symlink_status(link))) << f.path;
      EXPECT_FALSE(fs::exists(repo_dir() / "blobs" / blob_id(f))) << f.path;
      continue;
    }
    ++wanted;
    ASSERT_TRUE(fs::is_symlink(link)) << f.path;
    std::string up = "../../";
    for (char c : f.path)
      if (c == '/') up += "../";
    EXPECT_EQ(fs::read_symlink(link).string(), up + "blobs/" + blob_id(f)) << f.path;
    EXPECT_TRUE(fs::is_regular_file(repo_dir() / "blobs" / blob_id(f))) << f.path;
    EXPECT_EQ(read_file(link), f.content) << f.path;
  }
  // One blob per content (README.md twice), named by sha256 for LFS files and git oid otherwise; no
  // .incomplete left.
  std::set<std::string> blobs;
  for (const auto& e : fs::directory_iterator(repo_dir() / "blobs")) blobs.insert(e.path().filename().string());
  std::set<std::string> expect;
  for (const auto& f : files)
    if (mm3_wants_repo_file(f.path)) expect.insert(blob_id(f));
  EXPECT_EQ(blobs, expect);
  EXPECT_EQ(blobs.count(sha256_hex(find(files, "transformer/diffusion_pytorch_model.safetensors").content)), 1u);

  // The listing was paginated, the legacy files were never requested, LFS files came from the CDN
  // through the redirect, and the token went to the hub only.
  size_t tree_pages = 0;
  for (const auto& s : hub.seen()) {
    if (s.path.find("/tree/") != std::string::npos) ++tree_pages;
    EXPECT_EQ(s.path.find("qwen_7B"), std::string::npos) << s.path;
    EXPECT_EQ(s.path.find(".pth"), std::string::npos) << s.path;
    if (s.server == "hub") {
      EXPECT_EQ(s.auth, std::string("Bearer ") + kToken) << s.path;
    } else {
      EXPECT_EQ(s.auth, "") << "the token leaked to the CDN: " << s.path;
    }
  }
  EXPECT_GE(tree_pages, 5u);
  size_t cdn = 0, raw = 0;
  for (const auto& s : hub.file_requests()) (s.server == "cdn" ? cdn : raw)++;
  EXPECT_EQ(cdn, 2u);                 // the two wanted LFS files
  EXPECT_EQ(raw, expect.size() - 2);  // the regular files, README's blob once

  // Progress: a plan, then a done event per file with modular_model_index.json last.
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().kind, HfDownloadEvent::Kind::plan);
  EXPECT_EQ(events.front().count, wanted);
  std::vector<std::string> done;
  for (const auto& e : events)
    if (e.kind == HfDownloadEvent::Kind::done) done.push_back(e.path);
  ASSERT_EQ(done.size(), wanted);
  EXPECT_EQ(done.back(), "modular_model_index.json");

  // Again: nothing is fetched, every file is reported cached.
  hub.clear_seen();
  events.clear();
  hf_download_snapshot("test-org/test-model", o, {"modular_model_index.json"});
  EXPECT_TRUE(hub.file_requests().empty());
  for (const auto& e : events)
    if (e.kind == HfDownloadEvent::Kind::done) {
      EXPECT_TRUE(e.cached) << e.path;
    }
}

TEST_F(HfDownload, CorruptedFileFailsAndLeavesNoSnapshotEntry) {
  const auto files = small_repo();
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const std::string bad = "vocoder/diffusion_pytorch_model.safetensors";
  hub.corrupt.insert(bad);
  const std::vector<std::string> last = {"modular_model_index.json"};
  const std::string m =
      expect_throw<BadModel>([&] { hf_download_snapshot("test-org/test-model", mm3_options(), last); });
  EXPECT_NE(m.find(bad), std::string::npos) << m;
  EXPECT_NE(m.find("sha256 mismatch"), std::string::npos) << m;
  EXPECT_NE(m.find(sha256_hex(find(files, bad).content)), std::string::npos) << m;
  const fs::path blob = repo_dir() / "blobs" / blob_id(find(files, bad));
  EXPECT_FALSE(fs::exists(blob));
  EXPECT_FALSE(fs::exists(blob.string() + ".incomplete")) << "a corrupted download must be deleted";
  EXPECT_FALSE(fs::exists(fs::symlink_status(snapshot() / bad)));
  EXPECT_FALSE(fs::exists(snapshot() / "modular_model_index.json"));

  // A corrupted regular file (the index, fetched last) is caught by its git oid.
  hub.corrupt = {"modular_model_index.json"};
  const std::string m2 =
      expect_throw<BadModel>([&] { hf_download_snapshot("test-org/test-model", mm3_options(), last); });
  EXPECT_NE(m2.find("modular_model_index.json"), std::string::npos) << m2;
  EXPECT_NE(m2.find("git blob sha1 mismatch"), std::string::npos) << m2;
  EXPECT_FALSE(fs::exists(fs::symlink_status(snapshot() / "modular_model_index.json")));
  EXPECT_TRUE(fs::is_symlink(snapshot() / bad)) << "the repaired file stays";

  // Fixed server: the next run completes.
  hub.corrupt.clear();
  hf_download_snapshot("test-org/test-model", mm3_options(), last);
  EXPECT_EQ(read_file(snapshot() / bad), find(files, bad).content);
}

TEST_F(HfDownload, ResumesACutTransferWithRange) {
  const auto files = small_repo();
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const std::string big = "transformer/diffusion_pytorch_model.safetensors";
  const HubFile& f = find(files, big);
  hub.cut_once.insert(big);
  const std::string m = expect_throw<BadModel>([&] { hf_download_snapshot("test-org/test-model", mm3_options()); });
  EXPECT_NE(m.find("again to resume"), std::string::npos) << m;
  const fs::path inc = (repo_dir() / "blobs" / blob_id(f)).string() + ".incomplete";
  ASSERT_TRUE(fs::exists(inc));
  const uint64_t kept = fs::file_size(inc);
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, f.content.size());
  EXPECT_EQ(read_file(inc), f.content.substr(0, kept));
  EXPECT_FALSE(fs::exists(fs::symlink_status(snapshot() / big))) << "a partial file must not be in the snapshot";

  hub.clear_seen();
  hf_download_snapshot("test-org/test-model", mm3_options());
  bool ranged = false;
  for (const auto& s : hub.file_requests())
    if (s.path == "/cdn/" + blob_id(f)) {
      EXPECT_EQ(s.range, "bytes=" + std::to_string(kept) + "-");
      EXPECT_EQ(s.status, 206);
      ranged = true;
    }
  EXPECT_TRUE(ranged) << "the second run did not ask for the rest";
  EXPECT_EQ(read_file(snapshot() / big), f.content);
  EXPECT_FALSE(fs::exists(inc));
}

TEST_F(HfDownload, ResumesAPreCreatedHalfAndRestartsWhenRangeIsIgnored) {
  const auto files = small_repo();
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const HubFile& t = find(files, "transformer/diffusion_pytorch_model.safetensors");
  const HubFile& v = find(files, "vocoder/diffusion_pytorch_model.safetensors");
  fs::create_directories(repo_dir() / "blobs");
  // The transformer's first half as a previous run left it; for the vocoder, garbage that only a
  // restart from 0 (the server answers 200 to Range) can repair.
  std::ofstream((repo_dir() / "blobs" / (blob_id(t) + ".incomplete")).string(), std::ios::binary)
      << t.content.substr(0, t.content.size() / 2);
  std::ofstream((repo_dir() / "blobs" / (blob_id(v) + ".incomplete")).string(), std::ios::binary)
      << std::string(v.content.size() / 3, 'x');
  hub.ignore_range.insert(v.path);
  hf_download_snapshot("test-org/test-model", mm3_options());
  std::map<std::string, Seen> by_path;
  for (const auto& s : hub.file_requests()) by_path[s.path] = s;
  EXPECT_EQ(by_path["/cdn/" + blob_id(t)].range, "bytes=" + std::to_string(t.content.size() / 2) + "-");
  EXPECT_EQ(by_path["/cdn/" + blob_id(t)].status, 206);
  EXPECT_EQ(by_path["/cdn/" + blob_id(v)].range, "bytes=" + std::to_string(v.content.size() / 3) + "-");
  EXPECT_EQ(by_path["/cdn/" + blob_id(v)].status, 200);
  EXPECT_EQ(read_file(snapshot() / t.path), t.content);
  EXPECT_EQ(read_file(snapshot() / v.path), v.content);
}

TEST_F(HfDownload, CancelKeepsTheIncompleteForLater) {
  const auto files = small_repo();
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const HubFile& t = find(files, "transformer/diffusion_pytorch_model.safetensors");
  std::atomic<bool> stop{false};
  HfDownloadOptions o = mm3_options();
  o.on_progress = [&](const HfDownloadEvent& e) {
    if (e.path == t.path && e.kind == HfDownloadEvent::Kind::progress) stop = true;
  };
  o.should_cancel = [&] { return stop.load(); };
  expect_throw<Cancelled>([&] { hf_download_snapshot("test-org/test-model", o, {"modular_model_index.json"}); });
  EXPECT_TRUE(fs::exists((repo_dir() / "blobs" / blob_id(t)).string() + ".incomplete"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(snapshot() / t.path)));
  EXPECT_FALSE(fs::exists(snapshot() / "modular_model_index.json"));
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
}

TEST_F(HfDownload, HubErrorsAreBadModelWithTheFix) {
  FakeHub hub("test-org/test-model", small_repo(), 100);
  use(hub);
  std::string m = expect_throw<BadModel>([&] { resolve_model("nobody/nothing"); });
  EXPECT_NE(m.find("HTTP 404"), std::string::npos) << m;
  EXPECT_NE(m.find("nobody/nothing"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(repo_dir("nobody/nothing") / "snapshots"));

  HfDownloadOptions o = mm3_options();
  o.revision = "v9";
  m = expect_throw<BadModel>([&] { hf_download_snapshot("test-org/test-model", o); });
  EXPECT_NE(m.find("no revision 'v9'"), std::string::npos) << m;

  hub.gated = true;
  m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("HTTP 401"), std::string::npos) << m;
  EXPECT_NE(m.find("HF_TOKEN"), std::string::npos) << m;
  ::unsetenv("HF_TOKEN");
  m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("set HF_TOKEN"), std::string::npos) << m;
}

TEST_F(HfDownload, NetworkFailureIsBadModel) {
  // A free port nothing listens on: bound (not listening) and closed again.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  ::setenv("HF_ENDPOINT", ("http://127.0.0.1:" + std::to_string(port)).c_str(), 1);
  const std::string m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("cannot download test-org/test-model"), std::string::npos) << m;
}

TEST_F(HfDownload, MissingComponentIsBadModelBeforeDownloading) {
  auto files = small_repo();
  files.erase(
      std::remove_if(files.begin(), files.end(), [](const HubFile& f) { return f.path.rfind("vocoder/", 0) == 0; }),
      files.end());
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const std::string m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("vocoder/"), std::string::npos) << m;
  EXPECT_TRUE(hub.file_requests().empty());
}

TEST_F(HfDownload, NotEnoughDiskSpaceSaysHowMuch) {
  auto files = small_repo();
  files.push_back({"transformer/huge.safetensors", "x", true, uint64_t{1} << 60});
  FakeHub hub("test-org/test-model", files, 100);
  use(hub);
  const std::string m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("not enough disk space"), std::string::npos) << m;
  EXPECT_NE(m.find("HF_HUB_CACHE"), std::string::npos) << m;
  EXPECT_TRUE(hub.file_requests().empty());
}

TEST_F(HfDownload, OfflineOrNoDownloadNeverTouchesTheNetwork) {
  FakeHub hub("test-org/test-model", small_repo(), 100);
  use(hub);
  ::setenv("HF_HUB_OFFLINE", "1", 1);
  std::string m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model"); });
  EXPECT_NE(m.find("HF_HUB_OFFLINE"), std::string::npos) << m;
  ::unsetenv("HF_HUB_OFFLINE");
  ResolveOptions ro;
  ro.allow_download = false;
  m = expect_throw<BadModel>([&] { resolve_model("test-org/test-model", ro); });
  EXPECT_NE(m.find("--no-download"), std::string::npos) << m;
  EXPECT_TRUE(hub.seen().empty());
}

// The whole path on the real layout: the golden checkpoint served as MiniMaxAI/MiniMax-Music3 beside a
// dummy legacy layout; resolve_model downloads it, the checkpoint loads and validates (what `mm3
// inspect` does), and a second resolve is served by the cache alone.
TEST_F(HfDownload, ResolveModelDownloadsTheGoldenCheckpointOnFirstUse) {
  const fs::path ck = fs::path(MM3_GOLDEN_DIR) / "checkpoint";
  if (!fs::exists(ck / "modular_model_index.json")) GTEST_SKIP() << "golden checkpoint not found at " << ck;
  std::vector<HubFile> files;
  for (const auto& e : fs::recursive_directory_iterator(ck)) {
    if (!e.is_regular_file()) continue;
    HubFile f;
    f.path = fs::relative(e.path(), ck).generic_string();
    f.content = read_file(e.path());
    f.lfs = e.path().extension() == ".safetensors" || f.content.size() > (10 << 20);
    files.push_back(std::move(f));
  }
  files.push_back({"qwen_7B/qwen_7B/config.json", R"({"audio_vocab_size": 1024})", false});
  files.push_back({"qwen_7B/qwen_7B/model-00001-of-00001.safetensors", random_bytes(4096, 7), true});
  files.push_back({"flowmatching_vae.pth", random_bytes(4096, 8), true});
  files.push_back({"dav.pth", random_bytes(4096, 9), true});
  FakeHub hub(kDefaultModelRepo, files, 7);
  use(hub);

  size_t done = 0;
  ResolveOptions ro;
  ro.on_download = [&](const HfDownloadEvent& e) { done += e.kind == HfDownloadEvent::Kind::done; };
  const std::string dir = resolve_model(kDefaultModelRepo, ro);
  const fs::path repo = hf_repo_cache_dir(cache_, kDefaultModelRepo);
  EXPECT_EQ(fs::path(dir), repo / "snapshots" / kCommit);
  EXPECT_EQ(done, files.size() - 4);
  for (const auto& s : hub.seen()) {
    EXPECT_EQ(s.path.find("qwen_7B"), std::string::npos) << s.path;
    EXPECT_EQ(s.path.find(".pth"), std::string::npos) << s.path;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "qwen_7B"));
  EXPECT_FALSE(fs::exists(fs::symlink_status(fs::path(dir) / "dav.pth")));
  for (const auto& f : files)
    if (mm3_wants_repo_file(f.path)) {
      EXPECT_EQ(sha256_file_hex((fs::path(dir) / f.path).string()), sha256_hex(f.content)) << f.path;
    }

  Checkpoint loaded(dir);
  for (const auto& comp : loaded.configs().index.components)
    if (comp.name != "scheduler" && comp.name != "tokenizer") {
      EXPECT_GT(loaded.store(comp.name).total_params(), 0) << comp.name;
    }

  hub.clear_seen();
  EXPECT_EQ(resolve_model(kDefaultModelRepo), dir);
  EXPECT_TRUE(hub.seen().empty()) << "a cached model must not touch the network";
}

}  // namespace
}  // namespace mm3
