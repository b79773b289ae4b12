// Small text helpers shared by the deck (io) and the hardware files (plan).
#pragma once

#include <string>
#include <string_view>

namespace trident {

// YAML's double-quoted form of `s`: reads back as exactly `s`.
std::string yaml_quote(std::string_view s);

// Optimal string alignment distance (edits, with adjacent transpositions counting as one):
// how far a misspelt key is from a known one, for "did you mean" hints.
int edit_distance(std::string_view a, std::string_view b);

}  // namespace trident
