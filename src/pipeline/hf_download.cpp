// hf_download.cpp — see hf_download.h. HTTP(S) through cpp-httplib (redirects followed here, not by
// httplib, so the bearer token goes only to the endpoint's host and a relative Location resolves
// against the URL that sent it); digests through OpenSSL EVP; the cache layout is huggingface_hub's
// (file_download.py: blobs/, snapshots/<commit>/ symlinks made with os.path.relpath, refs/<revision>,
// .locks/), so either tool can finish or reuse the other's download.
#include "pipeline/hf_download.h"

#include <fcntl.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "core/errors.h"
#include "pipeline/model_resolve.h"

namespace mm3 {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxRedirects = 10;
constexpr size_t kWriteBuffer = size_t{4} << 20;
constexpr size_t kKeptErrorBody = 64 << 10;

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool is_hex(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string human_bytes(uint64_t b) {
  const char* u[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(b);
  int i = 0;
  while (v >= 1000 && i < 4) v /= 1000, ++i;
  return i ? fmt::format("{:.2f} {}", v, u[i]) : fmt::format("{} B", b);
}

// Percent-encodes everything but RFC 3986 unreserved characters (and '/' when keep_slash), like
// urllib.parse.quote(s, safe="/" or "").
std::string pct_encode(const std::string& s, bool keep_slash) {
  std::string o;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/'))
      o += static_cast<char>(c);
    else
      o += fmt::format("%{:02X}", c);
  }
  return o;
}

// ---- URLs ----

struct Url {
  std::string scheme;  // "http" | "https"
  std::string origin;  // scheme://host[:port]
  std::string host;    // without port
  std::string target;  // /path?query
};

Url split_url(const std::string& url) {
  const size_t p = url.find("://");
  Url u;
  if (p != std::string::npos) u.scheme = lower(url.substr(0, p));
  if (p == std::string::npos || (u.scheme != "http" && u.scheme != "https") || p + 3 >= url.size())
    throw BadModel(fmt::format("'{}' is not an http(s) URL (HF_ENDPOINT or a redirect from the hub)", url));
  const size_t s = url.find_first_of("/?#", p + 3);
  u.origin = url.substr(0, s);
  u.target = s == std::string::npos ? "/" : url.substr(s);
  if (!u.target.empty() && u.target[0] == '?') u.target = "/" + u.target;
  if (const size_t h = u.target.find('#'); h != std::string::npos) u.target.resize(h);
  std::string hp = u.origin.substr(p + 3);
  if (const size_t at = hp.rfind('@'); at != std::string::npos) hp = hp.substr(at + 1);
  if (!hp.empty() && hp[0] == '[')
    u.host = hp.substr(1, hp.find(']') - 1);
  else
    u.host = hp.substr(0, hp.find(':'));
  return u;
}

// RFC 3986 §5.2.4 on the path of a target ("/a/b/../c?q" -> "/a/c?q").
std::string remove_dot_segments(const std::string& target) {
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q), query = q == std::string::npos ? "" : target.substr(q);
  std::vector<std::string> out;
  size_t b = 1;
  bool trailing = false;
  while (b <= path.size()) {
    size_t e = path.find('/', b);
    if (e == std::string::npos) e = path.size();
    const std::string seg = path.substr(b, e - b);
    trailing = seg == "." || seg == ".." || (seg.empty() && e == path.size());
    if (seg == "..") {
      if (!out.empty()) out.pop_back();
    } else if (seg != "." && !(seg.empty() && e == path.size())) {
      out.push_back(seg);
    }
    b = e + 1;
  }
  std::string r;
  for (const auto& seg : out) r += "/" + seg;
  if (r.empty() || trailing) r += "/";
  return r + query;
}

// A Location header (absolute, scheme-relative, host-relative or path-relative) against the URL
// that answered with it.
std::string join_location(const Url& base, const std::string& loc) {
  const std::string l = lower(loc.substr(0, 8));
  if (l.rfind("http://", 0) == 0 || l.rfind("https://", 0) == 0) return loc;
  if (loc.rfind("//", 0) == 0) return base.scheme + ":" + loc;
  if (!loc.empty() && loc[0] == '/') return base.origin + remove_dot_segments(loc);
  const std::string path = base.target.substr(0, base.target.find('?'));
  if (!loc.empty() && loc[0] == '?') return base.origin + path + loc;
  return base.origin + remove_dot_segments(path.substr(0, path.rfind('/') + 1) + loc);
}

// The rel="next" target of RFC 8288 Link headers, or "".
std::string link_next(const httplib::Headers& headers) {
  for (auto [it, end] = headers.equal_range("Link"); it != end; ++it) {
    const std::string& v = it->second;
    size_t pos = 0;
    while ((pos = v.find('<', pos)) != std::string::npos) {
      const size_t close = v.find('>', pos);
      if (close == std::string::npos) break;
      const std::string target = v.substr(pos + 1, close - pos - 1);
      const size_t next_lt = v.find('<', close);
      const std::string params =
          lower(v.substr(close + 1, next_lt == std::string::npos ? std::string::npos : next_lt - close - 1));
      if (params.find("rel=\"next\"") != std::string::npos || params.find("rel=next") != std::string::npos)
        return target;
      pos = close;
    }
  }
  return "";
}

// ---- proxies ($HTTPS_PROXY / $HTTP_PROXY, minus $NO_PROXY and loopback) ----

bool proxy_bypassed(const std::string& host) {
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  std::string np = env_str("NO_PROXY");
  if (np.empty()) np = env_str("no_proxy");
  size_t b = 0;
  while (b <= np.size()) {
    size_t e = np.find(',', b);
    if (e == std::string::npos) e = np.size();
    std::string item = lower(trim(np.substr(b, e - b)));
    b = e + 1;
    if (item.empty()) continue;
    if (item == "*") return true;
    if (item[0] == '.') item = item.substr(1);
    const std::string h = lower(host);
    if (h == item || (h.size() > item.size() && h.compare(h.size() - item.size(), item.size(), item) == 0 &&
                      h[h.size() - item.size() - 1] == '.'))
      return true;
  }
  return false;
}

void apply_proxy(httplib::Client& cli, const Url& u) {
  if (proxy_bypassed(u.host)) return;
  std::string p = u.scheme == "https" ? env_str("HTTPS_PROXY") : env_str("HTTP_PROXY");
  if (p.empty()) p = u.scheme == "https" ? env_str("https_proxy") : env_str("http_proxy");
  if (p.empty()) return;
  if (p.find("://") == std::string::npos) p = "http://" + p;
  const Url pu = split_url(p);
  const std::string hp = pu.origin.substr(pu.origin.find("://") + 3);
  const size_t colon = hp.rfind(':');
  int port = 80;
  if (colon != std::string::npos && hp.find(']', colon) == std::string::npos) port = std::atoi(hp.c_str() + colon + 1);
  cli.set_proxy(pu.host, port);
}

// ---- HTTP ----

struct NetworkError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Reply {
  int status = 0;
  std::string url;  // of the final hop
  httplib::Headers headers;
  std::string body;      // without a sink, or when the final status is not 2xx (first 64 KiB)
  bool stopped = false;  // a handler returned false
};

using HeadersHandler = std::function<bool(const Reply&)>;          // final 2xx reply, before its body
using BodySink = std::function<bool(const char* data, size_t n)>;  // its body

bool is_redirect(int s) { return s == 301 || s == 302 || s == 303 || s == 307 || s == 308; }

class Hub {
 public:
  Hub(const HfDownloadOptions& opt, std::string endpoint, std::string token)
      : opt_(opt),
        endpoint_(std::move(endpoint)),
        token_(std::move(token)),
        endpoint_origin_(split_url(endpoint_).origin) {}

  const std::string& endpoint() const { return endpoint_; }
  bool has_token() const { return !token_.empty(); }

  // GET following redirects. With a sink, a final 2xx body streams to it (on_headers first).
  Reply get(const std::string& url, const httplib::Headers& headers, const HeadersHandler& on_headers = {},
            const BodySink& sink = {}) const {
    std::string cur = url;
    for (int hop = 0;; ++hop) {
      const Url u = split_url(cur);
      httplib::Client cli(u.origin);
      cli.set_connection_timeout(opt_.connect_timeout_s, 0);
      cli.set_read_timeout(opt_.read_timeout_s, 0);
      cli.set_write_timeout(opt_.read_timeout_s, 0);
      cli.set_follow_location(false);
      cli.set_keep_alive(false);
      cli.enable_server_certificate_verification(true);
      apply_proxy(cli, u);
      httplib::Headers h = headers;
      h.emplace("User-Agent", "mm3/0.1 (huggingface_hub-compatible cache)");
      // The token is for the hub, not for the CDN it redirects to (requests drops it the same way).
      if (!token_.empty() && u.origin == endpoint_origin_) h.emplace("Authorization", "Bearer " + token_);
      Reply rep;
      rep.url = cur;
      bool deliver = false;
      auto res = cli.Get(
          u.target, h,
          [&](const httplib::Response& r) {
            rep.status = r.status;
            rep.headers = r.headers;
            deliver = sink && r.status >= 200 && r.status < 300;
            if (deliver && on_headers && !on_headers(rep)) {
              rep.stopped = true;
              return false;
            }
            return true;
          },
          [&](const char* d, size_t n) {
            if (deliver) {
              if (!sink(d, n)) {
                rep.stopped = true;
                return false;
              }
              return true;
            }
            if (!sink || rep.body.size() < kKeptErrorBody) rep.body.append(d, n);
            return true;
          });
      if (!res) {
        if (rep.stopped) return rep;
        const httplib::Error e = res.error();
        std::string what;
        switch (e) {
          case httplib::Error::Connection:
            what = "could not connect";
            break;
          case httplib::Error::ConnectionTimeout:
            what = "connection timed out";
            break;
          case httplib::Error::Read:
            what = rep.status ? "connection lost during the transfer" : "no answer (read failed or timed out)";
            break;
          case httplib::Error::Write:
            what = "connection lost while sending the request";
            break;
          case httplib::Error::SSLConnection:
            what = "TLS handshake failed";
            break;
          case httplib::Error::SSLLoadingCerts:
          case httplib::Error::SSLServerVerification:
            what = "TLS certificate check failed (install ca-certificates, or point SSL_CERT_FILE at your CA bundle)";
            break;
          default:
            what = httplib::to_string(e);
        }
        throw NetworkError(fmt::format("{}: {}", u.origin, what));
      }
      if (is_redirect(rep.status) && res->has_header("Location")) {
        if (hop >= kMaxRedirects) throw NetworkError(fmt::format("{}: more than {} redirects", url, kMaxRedirects));
        cur = join_location(u, res->get_header_value("Location"));
        continue;
      }
      return rep;
    }
  }

 private:
  const HfDownloadOptions& opt_;
  std::string endpoint_, token_, endpoint_origin_;
};

// One line for a non-2xx answer of the hub: what and how to fix it.
[[noreturn]] void throw_status(const Hub& hub, const Reply& r, const std::string& repo, const std::string& revision,
                               const std::string& file = "") {
  std::string code, msg;
  for (const auto& [k, v] : r.headers) {
    if (lower(k) == "x-error-code") code = v;
    if (lower(k) == "x-error-message") msg = v;
  }
  const std::string where = file.empty() ? fmt::format("{} (revision {})", repo, revision)
                                         : fmt::format("{} of {} (revision {})", file, repo, revision);
  const std::string detail = msg.empty() ? "" : fmt::format(" [hub: {}]", msg);
  if (r.status == 401 || r.status == 403 || code == "GatedRepo") {
    if (hub.has_token())
      throw BadModel(fmt::format(
          "{} refused {} with the token in HF_TOKEN (HTTP {}){}: check that the token has read access and that you "
          "accepted the model's terms on {}/{}",
          hub.endpoint(), where, r.status, detail, hub.endpoint(), repo));
    throw BadModel(fmt::format(
        "{} refused {} (HTTP {}){}: the repo is gated or private, or does not exist. Accept its terms on {}/{} and "
        "set HF_TOKEN to a read token (https://huggingface.co/settings/tokens), or check the name (ORG/NAME)",
        hub.endpoint(), where, r.status, detail, hub.endpoint(), repo));
  }
  if (r.status == 404) {
    if (code == "RevisionNotFound")
      throw BadModel(fmt::format("{} has no revision '{}' on {} (HTTP 404){}: pass an existing branch, tag or commit",
                                 repo, revision, hub.endpoint(), detail));
    if (code == "EntryNotFound" || !file.empty())
      throw BadModel(
          fmt::format("{} was listed but is not on {} (HTTP 404){}: the repo changed during the download; "
                      "run again",
                      where, hub.endpoint(), detail));
    throw BadModel(
        fmt::format("no model repo '{}' (revision {}) on {} (HTTP 404){}: check the name (ORG/NAME) or "
                    "pass --model DIR with a local checkpoint folder",
                    repo, revision, hub.endpoint(), detail));
  }
  throw BadModel(fmt::format("{} answered HTTP {} for {} ({}){}; try again later, or set HF_ENDPOINT to a mirror",
                             split_url(r.url).origin, r.status, where, r.url, detail));
}

nlohmann::json parse_json(const Reply& r, const std::string& what) {
  try {
    return nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::exception& e) {
    throw BadModel(
        fmt::format("{} from {}: not valid JSON ({}); is HF_ENDPOINT a Hugging Face hub?", what, r.url, e.what()));
  }
}

// ---- digests ----

class Digest {
 public:
  explicit Digest(const EVP_MD* md) : md_(md), ctx_(EVP_MD_CTX_new()) {
    if (!ctx_) throw OutOfMemory("EVP_MD_CTX_new failed");
    reset();
  }
  ~Digest() { EVP_MD_CTX_free(ctx_); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void reset() {
    if (EVP_DigestInit_ex(ctx_, md_, nullptr) != 1) throw InternalError("EVP_DigestInit_ex failed");
  }
  void update(const void* d, size_t n) {
    if (n && EVP_DigestUpdate(ctx_, d, n) != 1) throw InternalError("EVP_DigestUpdate failed");
  }
  std::string hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_, out, &n) != 1) throw InternalError("EVP_DigestFinal_ex failed");
    std::string s;
    for (unsigned int i = 0; i < n; ++i) s += fmt::format("{:02x}", out[i]);
    return s;
  }

 private:
  const EVP_MD* md_;
  EVP_MD_CTX* ctx_;
};

// ---- files ----

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

[[noreturn]] void throw_io(const std::string& what, const fs::path& p) {
  throw BadModel(fmt::format("{} {}: {}", what, p.string(), std::strerror(errno)));
}

void write_all(int fd, const char* d, size_t n, const fs::path& p) {
  while (n > 0) {
    const ssize_t w = ::write(fd, d, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_io("cannot write", p);
    }
    d += w;
    n -= static_cast<size_t>(w);
  }
}

// An exclusive flock on {cache}/.locks/models--ORG--NAME/<id>.lock (huggingface_hub's filelock path),
// polled so that cancellation still works while another process holds it.
class BlobLock {
 public:
  BlobLock(const fs::path& path, const std::function<bool()>& should_cancel) : fd_(-1) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    fd_.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_.fd < 0) throw_io("cannot create the lock file", path);
    while (::flock(fd_.fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) throw_io("cannot lock", path);
      if (should_cancel && should_cancel()) throw Cancelled();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  Fd fd_;
};

struct RepoFile {
  std::string path;
  uint64_t size = 0;
  std::string blob;  // blobs/<blob>: the LFS sha256, else the git oid
  bool lfs = false;
};

bool safe_repo_path(const std::string& p) {
  if (p.empty() || p[0] == '/' || p.find('\0') != std::string::npos || p.find('\\') != std::string::npos) return false;
  size_t b = 0;
  while (b <= p.size()) {
    size_t e = p.find('/', b);
    if (e == std::string::npos) e = p.size();
    const std::string seg = p.substr(b, e - b);
    if (seg.empty() || seg == "." || seg == "..") return false;
    b = e + 1;
  }
  return true;
}

void link_into_snapshot(const fs::path& snapshot, const RepoFile& f) {
  const fs::path link = snapshot / f.path;
  fs::create_directories(link.parent_path());
  // relpath(blobs/<id>, dirname(snapshots/<commit>/<path>)): two levels up to the repo folder, one more
  // per folder in the path.
  std::string target = "../../";
  for (char c : f.path)
    if (c == '/') target += "../";
  target += "blobs/" + f.blob;
  std::error_code ec;
  if (fs::is_symlink(link, ec) && fs::read_symlink(link, ec).string() == target) return;
  // Atomic replace: a new link beside it, renamed over it.
  const fs::path tmp = link.string() + ".mm3-link";
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp);
  fs::rename(tmp, link);
}

void write_ref(const fs::path& repo_dir, const std::string& revision, const std::string& commit) {
  const fs::path ref = repo_dir / "refs" / revision;
  {
    std::ifstream in(ref);
    std::string cur;
    if (in && std::getline(in, cur) && trim(cur) == commit) return;
  }
  fs::create_directories(ref.parent_path());
  const fs::path tmp = ref.string() + ".mm3-tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << commit;
    if (!out) throw_io("cannot write", tmp);
  }
  fs::rename(tmp, ref);
}

struct Context {
  const HfDownloadOptions& opt;
  const Hub& hub;
  std::string repo, revision, commit;
  fs::path repo_dir, blobs, locks, snapshot;
  size_t count = 0;
};

void emit(const Context& c, const HfDownloadEvent& e) {
  if (c.opt.on_progress) c.opt.on_progress(e);
}

bool cancelled(const Context& c) { return c.opt.should_cancel && c.opt.should_cancel(); }

bool blob_complete(const fs::path& p, uint64_t size) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && fs::file_size(p, ec) == size && !ec;
}

// Fetches blobs/<id> (resuming its .incomplete) and checks it; returns false when it was already there.
bool fetch_blob(const Context& c, const RepoFile& f, size_t index) {
  const fs::path blob = c.blobs / f.blob;
  if (blob_complete(blob, f.size)) return false;
  BlobLock lock(c.locks / (f.blob + ".lock"), c.opt.should_cancel);
  if (blob_complete(blob, f.size)) return false;  // another process finished it meanwhile
  std::error_code ec;
  if (fs::exists(blob, ec)) fs::remove(blob, ec);  // a blob of the wrong size is not that blob

  const fs::path tmp = blob.string() + ".incomplete";
  Fd fd(::open(tmp.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.fd < 0) throw_io("cannot create", tmp);
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw_io("cannot stat", tmp);
  uint64_t have = static_cast<uint64_t>(st.st_size);
  if (have > f.size) {
    if (::ftruncate(fd.fd, 0) != 0) throw_io("cannot truncate", tmp);
    have = 0;
  }

  // LFS files are checked against their sha256; regular files against their git blob id.
  Digest dg(f.lfs ? EVP_sha256() : EVP_sha1());
  const std::string git_header = fmt::format("blob {}", f.size);
  auto restart_digest = [&] {
    dg.reset();
    if (!f.lfs) dg.update(git_header.c_str(), git_header.size() + 1);  // with its NUL
  };
  restart_digest();
  std::vector<char> buf;
  buf.reserve(kWriteBuffer);
  if (have > 0) {  // the kept prefix goes into the digest first
    buf.resize(kWriteBuffer);
    uint64_t off = 0;
    while (off < have) {
      const ssize_t r = ::pread(fd.fd, buf.data(), std::min<uint64_t>(buf.size(), have - off), static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) throw_io("cannot read", tmp);
      dg.update(buf.data(), static_cast<size_t>(r));
      off += static_cast<uint64_t>(r);
    }
    buf.clear();
  }
  if (::lseek(fd.fd, static_cast<off_t>(have), SEEK_SET) < 0) throw_io("cannot seek", tmp);

  uint64_t on_disk = have;  // bytes in the file, plus `buf`
  uint64_t fetched = 0;     // by this run
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  auto progress = [&](HfDownloadEvent::Kind kind) {
    HfDownloadEvent e;
    e.kind = kind;
    e.path = f.path;
    e.index = index;
    e.count = c.count;
    e.done = on_disk + buf.size();
    e.total = f.size;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.rate = s > 0 ? static_cast<double>(fetched) / s : 0;
    emit(c, e);
  };
  auto flush = [&] {
    if (buf.empty()) return;
    write_all(fd.fd, buf.data(), buf.size(), tmp);
    on_disk += buf.size();
    buf.clear();
  };
  progress(HfDownloadEvent::Kind::progress);

  if (have < f.size) {
    const std::string url =
        fmt::format("{}/{}/resolve/{}/{}", c.hub.endpoint(), c.repo, c.commit, pct_encode(f.path, true));
    httplib::Headers h{{"Accept-Encoding", "identity"}};
    if (have > 0) h.emplace("Range", fmt::format("bytes={}-", have));
    std::string bad;       // why the answer was refused
    bool discard = false;  // and whether what is on disk is wrong too
    bool was_cancelled = false;
    Reply rep;
    try {
      rep = c.hub.get(
          url, h,
          [&](const Reply& r) {
            if (r.status == 206) {
              // Content-Range: bytes <first>-<last>/<total>
              std::string cr;
              for (const auto& [k, v] : r.headers)
                if (lower(k) == "content-range") cr = v;
              unsigned long long first = 0;
              if (std::sscanf(cr.c_str(), "bytes %llu-", &first) != 1 || first != have) {
                bad = fmt::format("asked for bytes {}- and got Content-Range '{}'", have, cr);
                return false;
              }
              return true;
            }
            if (r.status != 200) {
              bad = fmt::format("HTTP {} to a download", r.status);
              return false;
            }
            if (on_disk > 0) {  // the server ignored Range: start over
              if (::ftruncate(fd.fd, 0) != 0 || ::lseek(fd.fd, 0, SEEK_SET) < 0) throw_io("cannot truncate", tmp);
              on_disk = 0;
              restart_digest();
            }
            return true;
          },
          [&](const char* d, size_t n) {
            if (on_disk + buf.size() + n > f.size) {
              bad = fmt::format("the server sent more than the {} bytes listed", f.size);
              discard = true;
              return false;
            }
            dg.update(d, n);
            buf.insert(buf.end(), d, d + n);
            fetched += n;
            if (buf.size() >= kWriteBuffer) flush();
            if (cancelled(c)) {
              was_cancelled = true;
              return false;
            }
            const auto now = std::chrono::steady_clock::now();
            if (now - last_report >= std::chrono::milliseconds(250)) {
              last_report = now;
              progress(HfDownloadEvent::Kind::progress);
            }
            return true;
          });
    } catch (const NetworkError& e) {
      flush();  // what arrived is kept for the next run
      throw BadModel(
          fmt::format("download of {} from {} stopped at {} of {} ({}); run the same command again to resume it",
                      f.path, c.repo, human_bytes(on_disk), human_bytes(f.size), e.what()));
    } catch (...) {
      flush();
      throw;
    }
    flush();
    if (was_cancelled)
      throw Cancelled(fmt::format("download of {} cancelled at {} of {}; run again to resume", f.path,
                                  human_bytes(on_disk), human_bytes(f.size)));
    if (!bad.empty()) {
      if (discard && ::ftruncate(fd.fd, 0) != 0) throw_io("cannot truncate", tmp);
      throw BadModel(fmt::format("download of {} from {}: {}{}; run again", f.path, c.repo, bad,
                                 discard ? "; the partial file was discarded" : ""));
    }
    if (rep.status < 200 || rep.status >= 300) throw_status(c.hub, rep, c.repo, c.revision, f.path);
    if (on_disk != f.size)
      throw BadModel(
          fmt::format("download of {} from {} ended at {} of {} bytes; run the same command again to resume it", f.path,
                      c.repo, on_disk, f.size));
  }

  const std::string got = dg.hex();
  const std::string want = lower(f.blob);
  if (got != want) {
    fd.fd = (::close(fd.fd), -1);
    fs::remove(tmp, ec);
    throw BadModel(fmt::format(
        "{} of {}: {} mismatch (expected {}, got {}); the corrupted download was deleted. Run again; if it repeats, "
        "the server or a proxy is altering the file",
        f.path, c.repo, f.lfs ? "sha256" : "git blob sha1", want, got));
  }
  if (::fsync(fd.fd) != 0) throw_io("cannot sync", tmp);
  fd.fd = (::close(fd.fd), -1);
  fs::rename(tmp, blob);
  progress(HfDownloadEvent::Kind::progress);
  return true;
}

std::string read_token() {
  for (const char* v : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
    if (std::string t = trim(env_str(v)); !t.empty()) return t;
  // `huggingface-cli login` stores it here.
  std::string path = env_str("HF_TOKEN_PATH");
  if (path.empty()) {
    const std::string home = env_str("HF_HOME");
    path = home.empty() ? (fs::path(env_str("HOME")) / ".cache" / "huggingface" / "token").string()
                        : (fs::path(home) / "token").string();
  }
  std::ifstream in(path);
  std::string t;
  if (in) std::getline(in, t);
  return trim(t);
}

}  // namespace

std::string hf_endpoint() {
  std::string e = trim(env_str("HF_ENDPOINT"));
  if (e.empty()) e = "https://huggingface.co";
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

bool hf_hub_offline() {
  const std::string v = lower(trim(env_str("HF_HUB_OFFLINE")));
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

bool is_hf_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return false;
  for (const std::string& part : {s.substr(0, slash), s.substr(slash + 1)}) {
    if (part.empty() || part[0] == '.' || part.find("..") != std::string::npos || part.size() > 96) return false;
    for (unsigned char ch : part)
      if (!std::isalnum(ch) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  return true;
}

std::string hf_repo_cache_dir(const std::string& cache_dir, const std::string& repo_id) {
  const size_t slash = repo_id.find('/');
  return (fs::path(cache_dir) / ("models--" + repo_id.substr(0, slash) + "--" + repo_id.substr(slash + 1))).string();
}

std::string sha256_hex(const std::string& bytes) {
  Digest d(EVP_sha256());
  d.update(bytes.data(), bytes.size());
  return d.hex();
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadModel(fmt::format("cannot read {}", path));
  Digest d(EVP_sha256());
  std::vector<char> buf(size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    d.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return d.hex();
}

std::string git_blob_sha1_hex(const std::string& bytes) {
  Digest d(EVP_sha1());
  const std::string h = fmt::format("blob {}", bytes.size());
  d.update(h.c_str(), h.size() + 1);
  d.update(bytes.data(), bytes.size());
  return d.hex();
}

std::string hf_download_snapshot(const std::string& repo_id, const HfDownloadOptions& opt,
                                 const std::vector<std::string>& last) {
  if (!is_hf_repo_id(repo_id))
    throw BadModel(
        fmt::format("'{}' is not a Hugging Face repo id (ORG/NAME of letters, digits, '-', '_', '.')", repo_id));
  std::string endpoint = opt.endpoint.empty() ? hf_endpoint() : opt.endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const Hub hub(opt, endpoint, opt.token.empty() ? read_token() : opt.token);
  const std::string revision = opt.revision.empty() ? "main" : opt.revision;
  const std::string cache = opt.cache_dir.empty() ? hf_hub_cache_dir() : opt.cache_dir;
  const std::string api = fmt::format("{}/api/models/{}", endpoint, repo_id);
  auto net_fail = [&](const NetworkError& e) -> BadModel {
    return BadModel(fmt::format(
        "cannot download {} from {} ({}). Check the network, set HF_ENDPOINT to a reachable mirror, or download "
        "it elsewhere and pass --model DIR",
        repo_id, endpoint, e.what()));
  };

  // 1. The commit the revision points to.
  std::string commit;
  try {
    const Reply r = hub.get(fmt::format("{}/revision/{}", api, pct_encode(revision, false)), {});
    if (r.status != 200) throw_status(hub, r, repo_id, revision);
    const nlohmann::json j = parse_json(r, "the revision API's answer");
    if (j.is_object() && j.contains("sha") && j["sha"].is_string()) commit = j["sha"].get<std::string>();
    if (!is_hex(commit) || (commit.size() != 40 && commit.size() != 64))
      throw BadModel(
          fmt::format("{}: no commit sha in the answer; is HF_ENDPOINT ({}) a Hugging Face hub?", r.url, endpoint));
  } catch (const NetworkError& e) {
    throw net_fail(e);
  }

  // 2. Every file of that commit (paginated listing).
  std::vector<RepoFile> files;
  try {
    std::string next = fmt::format("{}/tree/{}?recursive=true", api, commit);
    std::set<std::string> seen_pages;
    while (!next.empty()) {
      if (!seen_pages.insert(next).second) throw BadModel(fmt::format("{}: the listing's next page loops", next));
      const Reply r = hub.get(next, {});
      if (r.status != 200) throw_status(hub, r, repo_id, revision);
      const nlohmann::json j = parse_json(r, "the file listing");
      if (!j.is_array()) throw BadModel(fmt::format("{}: the file listing is not a JSON array", r.url));
      for (const auto& e : j) {
        if (!e.is_object() || e.value("type", "") != "file") continue;
        RepoFile f;
        f.path = e.value("path", "");
        if (!safe_repo_path(f.path))
          throw BadModel(fmt::format("{}: unsafe file path '{}' in the listing; refusing it", r.url, f.path));
        f.size = e.value("size", uint64_t{0});
        if (e.contains("lfs") && e["lfs"].is_object()) {
          f.lfs = true;
          f.blob = lower(e["lfs"].value("oid", ""));
          f.size = e["lfs"].value("size", f.size);
        } else {
          f.blob = lower(e.value("oid", ""));
        }
        if (f.blob.rfind("sha256:", 0) == 0) f.blob = f.blob.substr(7);
        if (!is_hex(f.blob) || (f.lfs ? f.blob.size() != 64 : (f.blob.size() != 40 && f.blob.size() != 64)))
          throw BadModel(fmt::format("{}: file '{}' has no usable {} in the listing", r.url, f.path,
                                     f.lfs ? "lfs.oid (sha256)" : "oid"));
        if (opt.include && !opt.include(f.path)) continue;
        files.push_back(std::move(f));
      }
      const std::string n = link_next(r.headers);
      next = n.empty() ? "" : join_location(split_url(r.url), n);
    }
  } catch (const NetworkError& e) {
    throw net_fail(e);
  }
  for (const std::string& req : opt.required) {
    const bool folder = !req.empty() && req.back() == '/';
    const bool found = std::any_of(files.begin(), files.end(), [&](const RepoFile& f) {
      return folder ? f.path.rfind(req, 0) == 0 : f.path == req;
    });
    if (!found)
      throw BadModel(fmt::format("{} (revision {}, commit {}) on {} has no {}{}; is it the right repo?", repo_id,
                                 revision, commit.substr(0, 12), endpoint, folder ? "folder " : "", req));
  }
  std::stable_partition(files.begin(), files.end(),
                        [&](const RepoFile& f) { return std::find(last.begin(), last.end(), f.path) == last.end(); });

  // 3. The cache folders and what remains to fetch.
  Context c{opt, hub, repo_id, revision, commit, fs::path(hf_repo_cache_dir(cache, repo_id)), {}, {}, {}, files.size()};
  c.blobs = c.repo_dir / "blobs";
  c.snapshot = c.repo_dir / "snapshots" / commit;
  c.locks = fs::path(cache) / ".locks" / c.repo_dir.filename();
  std::error_code ec;
  fs::create_directories(c.blobs, ec);
  if (ec) throw BadModel(fmt::format("cannot create the HF cache folder {}: {}", c.blobs.string(), ec.message()));
  fs::create_directories(c.snapshot, ec);
  if (ec) throw BadModel(fmt::format("cannot create {}: {}", c.snapshot.string(), ec.message()));
  uint64_t remaining = 0;
  std::set<std::string> planned;
  for (const RepoFile& f : files) {
    if (!planned.insert(f.blob).second || blob_complete(c.blobs / f.blob, f.size)) continue;
    uint64_t part = 0;
    const fs::path inc = c.blobs / (f.blob + ".incomplete");
    if (fs::is_regular_file(inc, ec)) part = fs::file_size(inc, ec);
    remaining += part <= f.size ? f.size - part : f.size;
  }
  const fs::space_info sp = fs::space(c.blobs, ec);
  if (!ec && sp.available < remaining)
    throw BadModel(fmt::format(
        "not enough disk space for {}: {} more are needed in {}, but only {} are free. Free some space, or set "
        "HF_HUB_CACHE to a folder on a larger disk",
        repo_id, human_bytes(remaining), c.blobs.string(), human_bytes(sp.available)));
  {
    HfDownloadEvent e;
    e.kind = HfDownloadEvent::Kind::plan;
    e.count = files.size();
    e.bytes = remaining;
    emit(c, e);
  }

  // 4. Each blob, then its snapshot link.
  for (size_t i = 0; i < files.size(); ++i) {
    if (cancelled(c)) throw Cancelled("download cancelled; run again to resume");
    const RepoFile& f = files[i];
    const bool fetched = fetch_blob(c, f, i + 1);
    link_into_snapshot(c.snapshot, f);
    HfDownloadEvent e;
    e.kind = HfDownloadEvent::Kind::done;
    e.path = f.path;
    e.index = i + 1;
    e.count = files.size();
    e.done = e.total = f.size;
    e.cached = !fetched;
    emit(c, e);
  }
  if (revision != commit) write_ref(c.repo_dir, revision, commit);
  return c.snapshot.string();
}

}  // namespace mm3
