#include "common/status.h"

#include <gtest/gtest.h>

namespace strider {
namespace {

Result<int> Half(int value) {
  if (value % 2 != 0) return Status::InvalidArgument("odd value " + std::to_string(value));
  return value / 2;
}

Result<int> Quarter(int value) {
  STRIDER_ASSIGN_OR_RETURN(int half, Half(value));
  STRIDER_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

TEST(Status, DefaultIsOk) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.ToString(), "OK");
}

TEST(Status, CarriesCodeMessageAndContext) {
  Status status = Status::NotFound("weights.safetensors").WithContext("loading checkpoint");
  EXPECT_TRUE(status.IsNotFound());
  EXPECT_EQ(status.ToString(), "NotFound: loading checkpoint: weights.safetensors");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
}

TEST(Result, PropagatesTheFirstError) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "odd value 3");
}

TEST(Result, OkStatusWithoutValueBecomesInternalError) {
  Result<int> result{Status::Ok()};
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfFailedResultAborts) {
  Result<int> failed{Status::Internal("boom")};
  EXPECT_DEATH((void)failed.value(), "boom");
}

}  // namespace
}  // namespace strider
