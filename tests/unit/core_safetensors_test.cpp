// core_safetensors_test.cpp — safetensors validation (every defect is a clear BadModel, never UB),
// zero-copy views, sharded checkpoints through the index, the golden checkpoint's layout, and faulting a mapping
// in before a pass (populate_read, populate_mapped_pages).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core_test_util.h"
#include "io/mmap_file.h"
#include "io/safetensors.h"
#include "model/quant_weights.h"

namespace mm3 {
namespace {

using test::safetensors_bytes;
using test::TempDir;
using test::write_bytes;

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}

// Expects BadModel whose message contains every fragment.
void expect_bad(const std::string& path, std::initializer_list<const char*> fragments) {
  try {
    SafetensorsFile f(path);
    FAIL() << "no error for " << path;
  } catch (const BadModel& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    for (const char* f : fragments) EXPECT_NE(m.find(f), std::string::npos) << "'" << f << "' not in: " << m;
  }
}

TEST(Safetensors, ReadsValidFileZeroCopy) {
  TempDir d;
  const std::string p = d.file("a.safetensors");
  write_bytes(p, safetensors_bytes(
                     R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]}})",
                     f32_bytes({1, 2, 3, 4}) + std::string("\x80\x3f\x00\x40", 4)));
  SafetensorsFile f(p);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor w = f.get("w");
  EXPECT_TRUE(w.is_borrowed() || true);  // aligned data is borrowed; misaligned data is copied
  EXPECT_EQ(w.shape(), (Shape{2, 2}));
  EXPECT_EQ(w.to_f32_vector(), (std::vector<float>{1, 2, 3, 4}));
  Tensor b = f.get("b");
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to_f32_vector(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_THROW(f.info("nope"), BadModel);
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  TempDir d;
  const std::string p = d.file("rt.safetensors");
  Tensor a = Tensor::from_f32({1.5f, -2.0f, 3.25f}, {3});
  Tensor b = Tensor::from_i64({7, -8}, {2, 1});
  write_safetensors(p, {{"a", a}, {"b", b}, {"c", a.to(DType::BF16)}});
  SafetensorsFile f(p);
  EXPECT_TRUE(f.get("a").is_borrowed());  // writer pads the header to 8 bytes: data is aligned
  EXPECT_EQ(f.get("a").to_f32_vector(), a.to_f32_vector());
  EXPECT_EQ(f.get("b").to_i64_vector(), (std::vector<int64_t>{7, -8}));
  EXPECT_EQ(f.get("c").dtype(), DType::BF16);
  EXPECT_FALSE(std::filesystem::exists(p + ".partial"));
}

TEST(Safetensors, RejectsTruncatedFiles) {
  TempDir d;
  write_bytes(d.file("empty.safetensors"), "");
  expect_bad(d.file("empty.safetensors"), {"truncated"});
  write_bytes(d.file("short.safetensors"), std::string("\x10\x00\x00", 3));
  expect_bad(d.file("short.safetensors"), {"truncated"});
  // Header length promises more bytes than the file has.
  std::string full = safetensors_bytes(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32_bytes({1, 2, 3, 4}));
  write_bytes(d.file("hdr.safetensors"), full.substr(0, 20));
  expect_bad(d.file("hdr.safetensors"), {"truncated"});
  // Data section cut short.
  write_bytes(d.file("data.safetensors"), full.substr(0, full.size() - 4));
  expect_bad(d.file("data.safetensors"), {"'w'", "past the data section"});
}

TEST(Safetensors, RejectsCorruptHeaders) {
  TempDir d;
  auto one = [&](const std::string& name, const std::string& header, const std::string& data,
                 std::initializer_list<const char*> frags) {
    write_bytes(d.file(name), safetensors_bytes(header, data));
    expect_bad(d.file(name), frags);
  };
  one("json.safetensors", R"({"w":{"dtype":"F32",)", "", {"not valid JSON"});
  one("arr.safetensors", R"([1,2])", "", {"not a JSON object"});
  one("dtype.safetensors", R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'),
      {"'w'", "unsupported dtype 'F64'"});
  one("size.safetensors", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'),
      {"'w'", "needs 12 bytes"});
  one("rev.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, '\0'),
      {"reversed"});
  one("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0'),
      {"non-negative"});
  one("overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0'), {"overlap", "'a'", "'b'"});
  one("missing.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'), {"data_offsets"});
  one("huge.safetensors", R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}})",
      std::string(4, '\0'), {"'w'"});
}

TEST(Safetensors, RejectsHeaderOver100MB) {
  TempDir d;
  std::string s(8, '\0');
  const uint64_t n = 100ull * 1000 * 1000 + 1;
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  write_bytes(d.file("big.safetensors"), s + "{}");
  expect_bad(d.file("big.safetensors"), {"100 MB"});
}

TEST(Safetensors, ShardedIndexPresentsOneStore) {
  TempDir d;
  write_safetensors(d.file("m-1.safetensors"), {{"a", Tensor::from_f32({1, 2}, {2})}});
  write_safetensors(d.file("m-2.safetensors"), {{"b", Tensor::from_f32({3}, {1})}});
  write_bytes(d.file("m.safetensors.index.json"),
              R"({"metadata":{},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}})");
  TensorStore s = TensorStore::open_dir(d.path().string());
  EXPECT_TRUE(s.sharded());
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.get("b").to_f32_vector(), (std::vector<float>{3}));
  EXPECT_NE(s.file_of("a").find("m-1.safetensors"), std::string::npos);
  EXPECT_EQ(s.total_params(), 3);
}

TEST(Safetensors, ShardedIndexDefects) {
  auto expect_store_bad = [](const TempDir& d, const char* frag) {
    try {
      TensorStore::open_dir(d.path().string());
      FAIL() << "no error";
    } catch (const BadModel& e) {
      EXPECT_NE(std::string(e.what()).find(frag), std::string::npos) << e.what();
    }
  };
  {
    TempDir d;  // index names a shard that does not exist
    write_bytes(d.file("m.safetensors.index.json"), R"({"weight_map":{"a":"m-9.safetensors"}})");
    expect_store_bad(d, "missing");
  }
  {
    TempDir d;  // index says a tensor is in a shard that does not hold it
    write_safetensors(d.file("m-1.safetensors"), {{"a", Tensor::from_f32({1}, {1})}});
    write_bytes(d.file("m.safetensors.index.json"), R"({"weight_map":{"a":"m-1.safetensors","z":"m-1.safetensors"}})");
    expect_store_bad(d, "'z'");
  }
  {
    TempDir d;  // shard holds a tensor the index does not list
    write_safetensors(d.file("m-1.safetensors"), {{"a", Tensor::from_f32({1}, {1})}, {"x", Tensor::from_f32({1}, {1})}});
    write_bytes(d.file("m.safetensors.index.json"), R"({"weight_map":{"a":"m-1.safetensors"}})");
    expect_store_bad(d, "not in the index");
  }
  {
    TempDir d;  // path traversal in the index
    write_bytes(d.file("m.safetensors.index.json"), R"({"weight_map":{"a":"../etc/passwd"}})");
    expect_store_bad(d, "same folder");
  }
  {
    TempDir d;  // no weights at all
    expect_store_bad(d, "no .safetensors");
  }
}

TEST(Safetensors, GoldenCheckpointLayout) {
  if (!test::have_golden()) GTEST_SKIP() << "golden set absent at " << test::golden_dir() << " (clone ../shared)";
  const auto ck = test::golden_dir() / "checkpoint";
  TensorStore lm = TensorStore::open_dir((ck / "language_model").string());
  EXPECT_TRUE(lm.sharded());
  EXPECT_EQ(lm.files().size(), 3u);
  EXPECT_EQ(lm.info("model.embed_tokens.weight").dtype, DType::BF16);
  EXPECT_EQ(lm.info("lm_head.weight").shape, (Shape{168100, 64}));
  TensorStore voc = TensorStore::open_dir((ck / "vocoder").string());
  EXPECT_FALSE(voc.sharded());
  EXPECT_EQ(voc.names().size(), 121u);
}

// Pages of [p, p + n) (4 KiB, p page-aligned) that are mapped in this process now: the present bit
// (63) of their /proc/self/pagemap entries. -1 when pagemap cannot be read.
long present_pages(const void* p, size_t n) {
  std::ifstream pm("/proc/self/pagemap", std::ios::binary);
  if (!pm) return -1;
  const size_t first = reinterpret_cast<uintptr_t>(p) / 4096, count = (n + 4095) / 4096;
  std::vector<uint64_t> e(count);
  pm.seekg(static_cast<std::streamoff>(first * 8));
  if (!pm.read(reinterpret_cast<char*>(e.data()), static_cast<std::streamsize>(count * 8))) return -1;
  long present = 0;
  for (uint64_t v : e) present += (v >> 63) & 1;
  return present;
}

// Sum of the byte at every 4 KiB page start of [p, p + n).
uint64_t page_sum(const unsigned char* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; i += 4096) s += p[i];
  return s;
}

// 48 MiB whose byte at offset i is (i / 4096) * 7 + 3 mod 256, and its page_sum.
std::string paged_bytes(uint64_t* sum) {
  std::string bytes(size_t(48) << 20, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i / 4096 * 7 + 3) & 0xFF);
  *sum = page_sum(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  return bytes;
}

// populate_read maps every page of the range in one call (a pass then takes no page faults): none of a
// fresh mapping's pages are present before, all are after, and the bytes are the file's. RED: a
// populate_read that returns true without the madvise leaves the pages absent.
TEST(MappedFile, PopulateReadMapsEveryPageOfTheRange) {
  TempDir d;
  const std::string p = d.file("pages.bin");
  uint64_t want = 0;
  write_bytes(p, paged_bytes(&want));
  auto m = MappedFile::open(p);
  const long pages = static_cast<long>(m->size() / 4096);
  const long before = present_pages(m->data(), m->size());
  if (before < 0) GTEST_SKIP() << "/proc/self/pagemap is not readable here";
  EXPECT_EQ(before, 0);
  if (!populate_read(m->data(), m->size())) GTEST_SKIP() << "this kernel has no MADV_POPULATE_READ (Linux < 5.14)";
  EXPECT_EQ(present_pages(m->data(), m->size()), pages);
  EXPECT_EQ(page_sum(m->data(), m->size()), want);
  // An unaligned start and an empty range are accepted.
  EXPECT_TRUE(populate_read(m->data() + 123, 4000));
  EXPECT_TRUE(populate_read(m->data(), 0));
}

// populate_mapped_pages does it for a borrowed tensor over the pool's threads (8 MiB pieces: the last
// one partial here); an owned tensor is left alone.
TEST(MappedFile, PopulateMappedPagesOfABorrowedTensor) {
  TempDir d;
  const std::string p = d.file("w.safetensors");
  uint64_t want = 0;
  std::string payload = paged_bytes(&want);
  payload.resize(payload.size() - 3 * 4096);  // 47.98 MiB: not a whole number of 8 MiB pieces
  want = page_sum(reinterpret_cast<const unsigned char*>(payload.data()), payload.size());
  // The header is padded so that the payload starts on a page of the file.
  std::string header = R"({"w":{"dtype":"F32","shape":[)" + std::to_string(payload.size() / 4) +
                       R"(],"data_offsets":[0,)" + std::to_string(payload.size()) + "]}}";
  header.append(4096 - 8 - header.size(), ' ');
  write_bytes(p, safetensors_bytes(header, payload));
  SafetensorsFile f(p);
  const Tensor w = f.get("w");
  ASSERT_TRUE(w.is_borrowed());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(w.raw()) % 4096, 0u);
  const auto* bytes = static_cast<const unsigned char*>(w.raw());
  if (present_pages(bytes, w.nbytes()) < 0) GTEST_SKIP() << "/proc/self/pagemap is not readable here";
  if (!populate_read(bytes, 1)) GTEST_SKIP() << "this kernel has no MADV_POPULATE_READ (Linux < 5.14)";
  ThreadPool pool(2);
  populate_mapped_pages(w, &pool);
  EXPECT_EQ(present_pages(bytes, w.nbytes()), static_cast<long>(w.nbytes() / 4096));
  EXPECT_EQ(page_sum(bytes, w.nbytes()), want);
  const Tensor owned = Tensor::from_f32({1, 2, 3}, {3});
  populate_mapped_pages(owned, &pool);
  populate_mapped_pages(owned, nullptr);
  EXPECT_EQ(owned.to_f32_vector(), (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace mm3
