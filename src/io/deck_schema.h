// The deck's schema: one row per key, the single source of truth for parsing, typing, range
// checks, to_yaml(), deck_reference() and every error message. Adding a key to Deck means adding
// one row to the table in deck_schema.cpp; nothing else names keys except the cross-key checks
// in deck.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "trident/deck.h"

namespace trident::deck_schema {

// A typed reference to one member of a Deck; the alternative is the key's storage type.
using Field = std::variant<int& (*)(Deck&), uint64_t& (*)(Deck&), double& (*)(Deck&),
                           bool& (*)(Deck&), std::string& (*)(Deck&)>;

// One end of an allowed range; `strict` turns >= into > (and <= into <).
struct Bound {
  double value;
  bool strict = false;
};

// What a string key holds: free text, a path (resolved when read), or one of `choices`.
enum class Text { kPlain, kPath, kEnum };

struct Key {
  std::string_view name;  // "section.leaf"
  Field field;
  std::optional<Bound> min = {};  // numbers only
  std::optional<Bound> max = {};
  Text text = Text::kPlain;  // strings only
  std::vector<std::string_view> choices = {};
  std::string_view help;

  std::string_view section() const { return name.substr(0, name.find('.')); }
  std::string_view leaf() const { return name.substr(name.find('.') + 1); }
};

// One value as read from YAML: the scalar's text, or what kind of node stood there instead.
struct Scalar {
  std::string text;
  std::string_view non_scalar;  // "", "nothing" (null), "a map", "a list"
};

const std::vector<Key>& keys();                   // schema order
const std::vector<std::string_view>& sections();  // in schema order
const Key* find(std::string_view name);           // nullptr if unknown
bool is_group(std::string_view name);  // "model.moe": a nested map of keys named model.moe.*
int index_of(const Key& key);          // position in keys()

// Types `value` by the key's schema and stores it; `where` starts any error message and
// `base_dir` (absolute) resolves a relative path. Throws input_error on a wrong type or enum.
void assign(const Key& key, Deck& deck, const Scalar& value, std::string_view where,
            const std::string& base_dir);
// Throws input_error if the stored value lies outside the key's range.
void check_range(const Key& key, const Deck& deck, std::string_view where);

std::string format_value(const Key& key, const Deck& deck);  // YAML text that reads back exactly
std::string type_text(const Key& key);                       // "an integer", "one of a|b", ...
std::string range_text(const Key& key);                      // "> 0", "in [0, 1)", "" if none

// How a message about `key` starts: "deck.yaml:3:9: train.lr" or "--set train.lr".
std::string subject(std::string_view where, std::string_view key);

}  // namespace trident::deck_schema
