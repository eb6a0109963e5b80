// pipeline_request_test.cpp — the strict request schema: defaults, unknown keys, wrong types, ranges.
#include <gtest/gtest.h>

#include "core/errors.h"
#include "pipeline/request.h"

namespace mm3 {
namespace {

void expect_refused(const std::string& json, const char* fragment) {
  try {
    parse_request_text(json, "req.json");
    FAIL() << "accepted: " << json;
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("req.json"), std::string::npos) << m;
    EXPECT_NE(m.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << m;
  }
}

TEST(Request, DefaultsAreTheReferences) {
  Request r = parse_request_text(R"({"caption": "pop", "lyrics": "[verse]\nhi"})");
  EXPECT_EQ(r.duration, 60.0);
  EXPECT_EQ(r.seed, 0u);
  EXPECT_EQ(r.steps, 30);
  EXPECT_DOUBLE_EQ(r.ar_cfg, 1.5);
  EXPECT_DOUBLE_EQ(r.dit_cfg, 1.7);
  EXPECT_EQ(r.sample_rate, 44100);
  EXPECT_EQ(r.format, "wav");
}

TEST(Request, AllKeysAndFullSeedRange) {
  Request r = parse_request_text(
      R"({"caption": "c", "lyrics": "l", "duration": 4, "seed": 18446744073709551615, "steps": 8,
          "ar_cfg": 1.0, "dit_cfg": 2, "sample_rate": 32000, "format": "flac"})");
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.steps, 8);
  EXPECT_EQ(r.sample_rate, 32000);
  EXPECT_EQ(r.format, "flac");
  Request back = parse_request(request_to_json(r));
  EXPECT_EQ(back.seed, r.seed);
  EXPECT_EQ(back.caption, r.caption);
}

TEST(Request, RefusesBadInput) {
  expect_refused(R"({"caption": "c", "lyrics": "l", "temperature": 1})", "unknown key 'temperature'");
  expect_refused(R"({"lyrics": "l"})", "'caption' is required");
  expect_refused(R"({"caption": "  \n", "lyrics": "l"})", "caption is empty");
  expect_refused(R"({"caption": "c", "lyrics": "\t"})", "lyrics are empty");
  expect_refused(R"({"caption": "c", "lyrics": "l", "duration": 0})", "duration 0");
  expect_refused(R"({"caption": "c", "lyrics": "l", "duration": 10000})", "duration 10000");
  expect_refused(R"({"caption": "c", "lyrics": "l", "duration": 0.01})", "shorter than one frame");
  expect_refused(R"({"caption": "c", "lyrics": "l", "duration": "4"})", "'duration' must be a number");
  expect_refused(R"({"caption": "c", "lyrics": "l", "seed": -1})", "'seed' must be in [0, 2^64)");
  expect_refused(R"({"caption": "c", "lyrics": "l", "seed": 1.5})", "'seed' must be an integer");
  expect_refused(R"({"caption": "c", "lyrics": "l", "steps": 2.5})", "'steps' must be an integer");
  expect_refused(R"({"caption": "c", "lyrics": "l", "steps": 0})", "steps 0");
  expect_refused(R"({"caption": "c", "lyrics": "l", "sample_rate": 48000})", "sample_rate 48000");
  expect_refused(R"({"caption": "c", "lyrics": "l", "format": "ogg"})", "format 'ogg'");
  expect_refused(R"({"caption": 5, "lyrics": "l"})", "'caption' must be a string");
  expect_refused(R"([1, 2])", "must be a JSON object");
  expect_refused(R"({"caption": "c", )", "not valid JSON");
}

}  // namespace
}  // namespace mm3
