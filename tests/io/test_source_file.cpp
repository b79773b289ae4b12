// testing::source_file (tests/support/source_file.h): the GPU tests find the decks they load
// when run from a carried bundle on another machine, where the compiled-in source path is
// absent. Each place it looks is tried on its own here.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "scratch_dir.h"
#include "source_file.h"
#include "trident/deck.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

class SourceFile : public testing::ScratchDirTest {
 protected:
  SourceFile() : ScratchDirTest("trident_source_file_") {}
  void SetUp() override {
    ScratchDirTest::SetUp();
    old_cwd_ = fs::current_path();
    unsetenv("TRIDENT_SOURCE_DIR");
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    unsetenv("TRIDENT_SOURCE_DIR");
    ScratchDirTest::TearDown();
  }
  void make(const fs::path& root) {
    fs::create_directories(root / "inputs");
    std::ofstream(root / "inputs" / "probe.txt") << "x";
  }
  fs::path old_cwd_;
};

TEST_F(SourceFile, TheEnvironmentComesFirst) {
  make(dir_ / "env");
  make(dir_ / "cwd");
  setenv("TRIDENT_SOURCE_DIR", (dir_ / "env").c_str(), 1);
  fs::current_path(dir_ / "cwd");
  EXPECT_EQ(testing::source_file("inputs/probe.txt", "/nonexistent"),
            (dir_ / "env" / "inputs" / "probe.txt").string());
}

TEST_F(SourceFile, ThenTheWorkingDirectoryThenTheBuiltInTree) {
  make(dir_ / "cwd");
  make(dir_ / "built");
  fs::current_path(dir_ / "cwd");
  EXPECT_EQ(testing::source_file("inputs/probe.txt", (dir_ / "built").string()),
            (dir_ / "cwd" / "inputs" / "probe.txt").string());
  fs::current_path(dir_);
  EXPECT_EQ(testing::source_file("inputs/probe.txt", (dir_ / "built").string()),
            (dir_ / "built" / "inputs" / "probe.txt").string());
}

// The carried-bundle case: the built-in tree is gone, the tests run from the repository root.
// The deck found there loads, with its data resolved next to it.
TEST_F(SourceFile, TheTinyDeckLoadsFromTheWorkingDirectory) {
  fs::current_path(TRIDENT_SOURCE_DIR);
  const Deck d = load_deck(testing::source_file("inputs/gpt-tiny.yaml", "/nonexistent"));
  EXPECT_TRUE(fs::exists(d.data.train)) << d.data.train;
}

TEST_F(SourceFile, NowhereNamesEveryPlaceTried) {
  fs::current_path(dir_);
  setenv("TRIDENT_SOURCE_DIR", "/nonexistent-env", 1);
  try {
    testing::source_file("inputs/probe.txt", "/nonexistent-built");
    FAIL() << "found a file that is nowhere";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& place :
         {std::string("/nonexistent-env/inputs/probe.txt"), (dir_ / "inputs/probe.txt").string(),
          std::string("/nonexistent-built/inputs/probe.txt"), std::string("TRIDENT_SOURCE_DIR")})
      EXPECT_NE(what.find(place), std::string::npos) << place << " not in: " << what;
  }
}

}  // namespace
}  // namespace trident
