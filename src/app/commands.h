// The subcommands of the trident binary. main.cpp parses the command line; each command builds
// the parts it needs and runs. Errors are thrown as trident::Error and turned into exit codes
// by main.
#pragma once

#include <string>
#include <vector>

namespace trident {

struct DeckArgs {
  std::string deck;
  std::vector<std::string> overrides;  // --set key=value, in order
};

struct BenchArgs {
  DeckArgs deck;
  int warmup_steps = 2;
  int steps = 5;
};

int run_train(const DeckArgs& args);
int run_bench(const BenchArgs& args);
int run_grid(int world, int dp, int tp, int pp);

}  // namespace trident
