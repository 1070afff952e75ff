// The safetensors reader on files written here byte by byte: every malformed header is refused
// with c10::ValueError naming the file and the tensor, and a well-formed one reads back exactly.
#include <gtest/gtest.h>

#include <hyper_parallel/checkpoint/safetensors.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "../../common/test_files.h"

namespace hp = hyper_parallel;

// Its own namespace: the test units are compiled in unity batches, where files share a scope.
namespace t_unit_checkpoint_safetensors_test {
namespace {

struct TempFile {
  explicit TempFile(const std::string& bytes) {
    char name[] = "/tmp/hp_safetensors_XXXXXX";
    const int fd = ::mkstemp(name);
    path = name;
    ::close(fd);
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { std::remove(path.c_str()); }
  std::string path;
};

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.begin(), s.size());
  return s;
}

void refused(const std::string& header, const std::string& data, const std::string& needle) {
  TempFile f(hp_test::safetensors_bytes(header, data));
  try {
    hp::SafetensorsFile s(f.path);
    ADD_FAILURE() << "accepted: " << header;
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(f.path), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Safetensors, ReadsTensorsAndBoxesWithCasts) {
  const std::string data = floats({1, 2, 3, 4, 5, 6}) + std::string("\x01\x02", 2);
  TempFile f(hp_test::safetensors_bytes(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"U8","shape":[2],"data_offsets":[24,26]}})",
                       data));
  hp::SafetensorsFile s(f.path);
  EXPECT_EQ(s.metadata().at("format"), "pt");
  ASSERT_EQ(s.tensors().size(), 2u);
  EXPECT_TRUE(at::equal(s.tensor("a"), at::arange(1, 7, at::kFloat).reshape({2, 3})));
  at::Tensor box = at::empty({2, 2}, at::kDouble);
  EXPECT_EQ(s.read_box("a", {0, 1}, box), 4 * 4);
  EXPECT_TRUE(at::equal(box, at::tensor({2.0, 3.0, 5.0, 6.0}, at::kDouble).reshape({2, 2})));
  EXPECT_TRUE(at::equal(s.tensor("b"), at::tensor({1, 2}, at::kByte)));
  at::Tensor outside = at::empty({2, 2}, at::kFloat);
  EXPECT_THROW(s.read_box("a", {1, 0}, outside), c10::ValueError);
  EXPECT_THROW(s.tensor("missing"), c10::ValueError);
}

TEST(Safetensors, MalformedHeadersAreRefusedByName) {
  const std::string d = floats({1, 2, 3, 4});
  refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", d + d,
          "tensor 'b' overlaps");
  refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", d,
          "before tensor 'b' belong to no tensor");
  refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d + "xx", "the file holds 18 bytes");
  refused(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", d, "tensor 'a': its data_offsets [0,16] span 16 bytes");
  refused(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", d, "end before they begin");
  refused(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", d, "non-negative integers");
  refused(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", d, "more than the file holds");
  refused(R"({"a":{"dtype":"C64","shape":[2],"data_offsets":[0,16]}})", d, "dtype 'C64' is not supported");
  refused(R"({"a":{"dtype":"F32","shape":[4]}})", d, "lacks 'data_offsets'");
  refused(R"({"a":[1,2]})", d, "tensor 'a': its entry is not an object");
  refused(R"({"__metadata__":{"format":1}})", "", "__metadata__ entry 'format' is not a string");
  refused(R"([1,2,3])", "", "not a JSON object");
  refused(R"({"a":)", "", "not valid JSON");
}

}  // namespace t_unit_checkpoint_safetensors_test
