#include "common/durable_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

class DurableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::ScratchDir("strider_durable_file_test");
  }
  void TearDown() override { ::chmod(dir_.c_str(), 0755); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Every name in the directory, hidden ones included: a temporary left behind shows here.
  std::vector<std::string> Entries(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::vector<std::string> Entries() const { return Entries(dir_); }

  std::string dir_;
};

TEST_F(DurableFileTest, CreatesThenReplacesTheWholeContents) {
  const std::string path = Path("record.json");
  ASSERT_TRUE(WriteFileDurably(path, "a much longer first version\n").ok());
  EXPECT_EQ(Read(path), "a much longer first version\n");
  ASSERT_TRUE(WriteFileDurably(path, "second\n").ok());
  EXPECT_EQ(Read(path), "second\n") << "the old, longer contents must not show through";
  ASSERT_TRUE(WriteFileDurably(path, "").ok());
  EXPECT_EQ(Read(path), "");
  EXPECT_EQ(Entries(), std::vector<std::string>{"record.json"});
}

TEST_F(DurableFileTest, StreamedPiecesArriveInOrder) {
  const std::string path = Path("pieces.bin");
  ASSERT_TRUE(WriteFileDurablyStreamed(path, [](const FileAppender& append) {
                for (const char* piece : {"one ", "", "two ", "three"}) {
                  STRIDER_RETURN_IF_ERROR(append(piece));
                }
                return Status::Ok();
              }).ok());
  EXPECT_EQ(Read(path), "one two three");
  EXPECT_EQ(Entries(), std::vector<std::string>{"pieces.bin"});
}

TEST_F(DurableFileTest, AnExactModeIsSetWhateverTheUmask) {
  const mode_t previous = ::umask(0077);
  Status secret = WriteFileDurably(Path("key_secret"), "s", 0600);
  Status open = WriteFileDurably(Path("key"), "p", 0644);
  Status plain = WriteFileDurably(Path("plain"), "x");
  ::umask(previous);
  ASSERT_TRUE(secret.ok() && open.ok() && plain.ok());
  auto mode = [&](const std::string& name) {
    struct stat info;
    EXPECT_EQ(::stat(Path(name).c_str(), &info), 0);
    return info.st_mode & 07777;
  };
  EXPECT_EQ(mode("key_secret"), 0600u);
  EXPECT_EQ(mode("key"), 0644u);
  EXPECT_EQ(mode("plain"), 0600u) << "without an exact mode the umask applies";
}

TEST_F(DurableFileTest, AFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string path = Path("weights.bin");
  ASSERT_TRUE(WriteFileDurably(path, "old contents").ok());
  // Fails after part of the new contents reached the temporary, as a full disk would.
  Status status = WriteFileDurablyStreamed(path, [](const FileAppender& append) {
    STRIDER_RETURN_IF_ERROR(append("half of the new"));
    return Status::ResourceExhausted("tensor 'w': no space left");
  });
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("tensor 'w'"), std::string::npos) << status.ToString();
  EXPECT_EQ(Read(path), "old contents");
  EXPECT_EQ(Entries(), std::vector<std::string>{"weights.bin"});
}

TEST_F(DurableFileTest, AThrowingWriterLeavesTheOldFileAndNoTemporary) {
  const std::string path = Path("weights.bin");
  ASSERT_TRUE(WriteFileDurably(path, "old contents").ok());
  // The exception is the writer's to report: it passes through, and the temporary goes.
  auto throws = [](const FileAppender& append) -> Status {
    STRIDER_RETURN_IF_ERROR(append("half of the new"));
    throw std::runtime_error("out of memory building the next tensor");
  };
  EXPECT_THROW(static_cast<void>(WriteFileDurablyStreamed(path, throws)), std::runtime_error);
  EXPECT_EQ(Read(path), "old contents");
  EXPECT_EQ(Entries(), std::vector<std::string>{"weights.bin"});
}

TEST_F(DurableFileTest, AMissingDirectoryIsAnIoErrorNamingThePath) {
  const std::string path = Path("absent/record.json");
  Status status = WriteFileDurably(path, "x");
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
  EXPECT_FALSE(fs::exists(Path("absent")));
  EXPECT_TRUE(Entries().empty());
}

TEST_F(DurableFileTest, AnUnwritableDirectoryLeavesTheOldFile) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root, which permission bits do not stop; "
                    "AFailedWriteLeavesTheOldFileAndNoTemporary covers the failure path";
  }
  const std::string path = Path("record.json");
  ASSERT_TRUE(WriteFileDurably(path, "old").ok());
  ASSERT_EQ(::chmod(dir_.c_str(), 0555), 0);
  Status status = WriteFileDurably(path, "new");
  ::chmod(dir_.c_str(), 0755);
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
  EXPECT_EQ(Read(path), "old");
  EXPECT_EQ(Entries(), std::vector<std::string>{"record.json"});
}

TEST_F(DurableFileTest, AFailedRenameLeavesTheTargetAndNoTemporary) {
  // rename(2) cannot put a file over a non-empty directory, whoever runs the test.
  const std::string path = Path("occupied");
  fs::create_directories(path);
  ASSERT_TRUE(WriteFileDurably(path + "/inside.txt", "kept").ok());
  Status status = WriteFileDurably(path, "new");
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
  EXPECT_EQ(Read(path + "/inside.txt"), "kept");
  EXPECT_EQ(Entries(), std::vector<std::string>{"occupied"});
}

TEST_F(DurableFileTest, ABareFileNameIsWrittenInTheWorkingDirectory) {
  const fs::path previous = fs::current_path();
  fs::current_path(dir_);
  Status status = WriteFileDurably("bare.txt", "here");
  fs::current_path(previous);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(Read(Path("bare.txt")), "here");
}

TEST_F(DurableFileTest, ConcurrentWritersOfOnePathEachLeaveAWholeFile) {
  const std::string path = Path("shared.txt");
  const std::string a(64 * 1024, 'a'), b(32 * 1024, 'b');
  std::vector<std::thread> writers;
  for (const std::string* contents : {&a, &b}) {
    writers.emplace_back([&path, contents] {
      for (int i = 0; i < 20; ++i) EXPECT_TRUE(WriteFileDurably(path, *contents).ok());
    });
  }
  for (std::thread& writer : writers) writer.join();
  const std::string last = Read(path);
  EXPECT_TRUE(last == a || last == b) << "a file of " << last.size() << " bytes mixes writers";
  EXPECT_EQ(Entries(), std::vector<std::string>{"shared.txt"});
}

TEST_F(DurableFileTest, RenamesFilesAndDirectoriesAcrossDirectories) {
  ASSERT_TRUE(WriteFileDurably(Path("from.txt"), "moved").ok());
  fs::create_directories(Path("sub"));
  ASSERT_TRUE(RenameDurably(Path("from.txt"), Path("sub/to.txt")).ok());
  EXPECT_EQ(Read(Path("sub/to.txt")), "moved");
  EXPECT_FALSE(fs::exists(Path("from.txt")));

  ASSERT_TRUE(RenameDurably(Path("sub"), Path("renamed")).ok());
  EXPECT_EQ(Read(Path("renamed/to.txt")), "moved");
  EXPECT_EQ(Entries(), std::vector<std::string>{"renamed"});
}

TEST_F(DurableFileTest, RenamingAMissingSourceNamesItAndChangesNothing) {
  ASSERT_TRUE(WriteFileDurably(Path("to.txt"), "kept").ok());
  Status status = RenameDurably(Path("missing.txt"), Path("to.txt"));
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(Path("missing.txt")), std::string::npos) << status.ToString();
  EXPECT_EQ(Read(Path("to.txt")), "kept");
}

TEST_F(DurableFileTest, SyncingAMissingDirectoryFailsNamingIt) {
  Status status = FsyncDirectory(Path("nowhere"));
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status.ToString();
  EXPECT_NE(status.message().find(Path("nowhere")), std::string::npos) << status.ToString();
  EXPECT_TRUE(FsyncDirectory(dir_).ok());
}

}  // namespace
}  // namespace strider
