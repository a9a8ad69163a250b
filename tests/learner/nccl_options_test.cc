// How the learner group configures NCCL (learner/distributed.h): the environment that turns a
// dead or hung rank into an error in the survivors rather than a killed process, the options
// each NCCL process group is created with, and the device checks Join makes before any
// rendezvous. None of it needs a GPU: options are plain objects, and the device checks fail
// on a device index that is not there.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "learner/distributed.h"

#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace strider {
namespace {

// Saves the NCCL variables and unsets them; restores them when it goes.
class NcclEnvironmentScope {
 public:
  NcclEnvironmentScope() {
    for (const auto& [name, value] : NcclEnvironment()) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old == nullptr ? std::nullopt : std::optional<std::string>(old);
      unsetenv(name.c_str());
    }
  }
  ~NcclEnvironmentScope() {
    for (const auto& [name, value] : saved_) {
      if (value.has_value()) {
        setenv(name.c_str(), value->c_str(), 1);
      } else {
        unsetenv(name.c_str());
      }
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string Env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  return value == nullptr ? "<unset>" : value;
}

TEST(NcclEnvironmentTest, ErrorsReachTheWaitingRankInsteadOfKillingIt) {
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"TORCH_NCCL_BLOCKING_WAIT", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"},
      {"TORCH_NCCL_ENABLE_MONITORING", "0"},
      {"TORCH_NCCL_DUMP_ON_TIMEOUT", "0"}};
  EXPECT_EQ(NcclEnvironment(), expected);
}

TEST(NcclEnvironmentTest, SetsWhatIsUnsetAndKeepsWhatTheOperatorSet) {
  NcclEnvironmentScope scope;
  setenv("TORCH_NCCL_BLOCKING_WAIT", "0", 1);
  const std::vector<std::string> set = ApplyNcclEnvironment();
  EXPECT_EQ(set, (std::vector<std::string>{"TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                           "TORCH_NCCL_ENABLE_MONITORING",
                                           "TORCH_NCCL_DUMP_ON_TIMEOUT"}));
  EXPECT_EQ(Env("TORCH_NCCL_BLOCKING_WAIT"), "0");
  EXPECT_EQ(Env("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "2");
  EXPECT_EQ(Env("TORCH_NCCL_ENABLE_MONITORING"), "0");
  EXPECT_EQ(Env("TORCH_NCCL_DUMP_ON_TIMEOUT"), "0");
  // A second call finds everything set.
  EXPECT_TRUE(ApplyNcclEnvironment().empty());
}

// A device index past the last one fails in Join itself, naming the device, before the
// rendezvous (nothing listens on the port): in the CPU build because LibTorch has no NCCL, in
// the CUDA build because the device is not there.
TEST(NcclJoinTest, AMissingDeviceFailsBeforeTheRendezvous) {
  LearnerGroupOptions options;
  options.world_size = 2;
  options.host = "127.0.0.1";
  options.port = 1;  // never reached
  options.timeout_s = 1;
#ifdef USE_C10D_NCCL
  const int devices = c10::cuda::device_count();
#else
  const int devices = 0;
#endif
  options.cuda_device = devices;
  auto group = LearnerGroup::Join(options);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kInvalidArgument) << group.status().message();
  const std::string message(group.status().message());
  EXPECT_NE(message.find("learner rank 0 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("cuda:" + std::to_string(devices)), std::string::npos) << message;
#ifdef USE_C10D_NCCL
  EXPECT_NE(message.find("this machine has " + std::to_string(devices) + " CUDA devices"),
            std::string::npos)
      << message;
#else
  EXPECT_NE(message.find("no CUDA or NCCL"), std::string::npos) << message;
#endif
}

TEST(NcclOptionsTest, CarryTheGroupsTimeoutAndName) {
#ifndef USE_C10D_NCCL
  GTEST_SKIP() << "this LibTorch has no NCCL process group (the CUDA build has)";
#else
  LearnerGroupOptions options;
  options.rank = 1;
  options.world_size = 4;
  options.cuda_device = 1;
  options.timeout_s = 7.5;
  auto nccl = NcclOptions(options, "gradients");
  ASSERT_TRUE(nccl.ok()) << nccl.status().message();
  const auto& o = **nccl;
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(7500));
  EXPECT_EQ(o.backend, "nccl");
  EXPECT_FALSE(o.is_high_priority_stream);
  EXPECT_EQ(o.group_name, "strider/gradients");
  EXPECT_EQ(o.global_ranks_in_group, (std::vector<uint64_t>{0, 1, 2, 3}));

  auto experts = NcclOptions(options, "experts");
  ASSERT_TRUE(experts.ok()) << experts.status().message();
  EXPECT_EQ((*experts)->group_name, "strider/experts");
  EXPECT_NE(experts->get(), nccl->get());  // a communicator of its own
#endif
}

TEST(NcclOptionsTest, RefuseNoDeviceAndNoTimeout) {
#ifndef USE_C10D_NCCL
  GTEST_SKIP() << "this LibTorch has no NCCL process group (the CUDA build has)";
#else
  LearnerGroupOptions options;
  options.cuda_device = -1;
  auto none = NcclOptions(options, "experts");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(none.status().message()).find("no CUDA device"), std::string::npos)
      << none.status().message();

  options.cuda_device = 0;
  options.timeout_s = 0;
  auto zero = NcclOptions(options, "experts");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(zero.status().message()).find("timeout_s"), std::string::npos)
      << zero.status().message();
#endif
}

}  // namespace
}  // namespace strider
