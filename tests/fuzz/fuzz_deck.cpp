// The deck parser with --set overrides. An input is deck text, optionally followed by a line
// "--set" and then one override per line ("train.lr=1e-3"), as `trident train DECK --set ...`
// would pass them. Besides the contract in fuzz_support.h, a deck that parses must survive its
// own resolved form: to_yaml() is what every run saves as deck.yaml and what checkpoints carry,
// so parsing it back must give the same deck.
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "trident/deck.h"

namespace {

constexpr std::string_view kSetLine = "\n--set\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trident;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find(kSetLine);
  const std::string text = input.substr(0, split);
  std::vector<std::string> overrides;
  if (split != std::string::npos) {
    size_t at = split + kSetLine.size();
    while (at <= input.size()) {
      const size_t end = std::min(input.find('\n', at), input.size());
      overrides.push_back(input.substr(at, end - at));
      at = end + 1;
    }
  }
  Deck deck;
  if (!fuzz::accepts([&] { deck = parse_deck(text, "/fuzz", overrides); })) return 0;
  const std::string resolved = deck.to_yaml();
  Deck again;
  if (!fuzz::accepts([&] { again = parse_deck(resolved, "/fuzz"); }))
    fuzz::finding("the resolved deck does not parse", resolved);
  if (!(again == deck)) fuzz::finding("the resolved deck parses to another deck", resolved);
  return 0;
}
