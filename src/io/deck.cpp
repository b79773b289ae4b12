// Reading a deck: YAML file -> schema-typed values -> --set overrides -> range and cross-key
// checks -> defaults that depend on the file (run.out_dir). Keys, types and ranges live in the
// schema table (deck_schema.cpp); this file walks the YAML and decides where errors point.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include "core/text.h"
#include "io/deck_schema.h"
#include "trident/check.h"
#include "trident/deck.h"

namespace trident {
namespace {

namespace fs = std::filesystem;
using deck_schema::Key;
using deck_schema::Scalar;

// A deck being read, and where each key's value came from, so that a range or cross-key error
// points at the line (or the --set) that set the value rather than at the whole file.
struct DeckReader {
  Deck deck;
  std::string label;                // the deck path as the user wrote it, or "(deck text)"
  std::vector<std::string> origin;  // per schema key: "deck.yaml:3:9", "--set", or label

  DeckReader(std::string label_) : label(std::move(label_)) {
    origin.assign(deck_schema::keys().size(), label);
  }
  const std::string& origin_of(std::string_view name) const {
    return origin[deck_schema::index_of(*deck_schema::find(name))];
  }
  // Where to point an error about several keys: a --set among them, else the first one the
  // file set, else the deck as a whole.
  std::string blame(std::initializer_list<std::string_view> names) const {
    for (std::string_view n : names)
      if (origin_of(n) == "--set") return "--set";
    for (std::string_view n : names)
      if (origin_of(n) != label) return origin_of(n);
    return label;
  }
};

std::string at_mark(const std::string& label, const YAML::Mark& mark) {
  if (mark.is_null()) return label;
  return fmt::format("{}:{}:{}", label, mark.line + 1, mark.column + 1);  // yaml-cpp counts from 0
}

Scalar scalar_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar: return {node.Scalar(), ""};
    case YAML::NodeType::Sequence: return {"", "a list"};
    case YAML::NodeType::Map: return {"", "a map"};
    default: return {"", "nothing"};
  }
}

std::string section_keys(std::string_view section) {
  std::string out;
  for (const Key& k : deck_schema::keys())
    if (k.section() == section) out += fmt::format("{}{}", out.empty() ? "" : ", ", k.leaf());
  return out;
}

// The closest known name within two edits, or a key in another section with the same leaf
// ("train.seq_len" -> "model.seq_len"); empty if nothing is close.
std::string suggestion(std::string_view name, bool is_section) {
  std::string best;
  int best_d = 3;
  auto consider = [&](std::string_view candidate) {
    int d = edit_distance(name, candidate);
    if (d < best_d) best_d = d, best = std::string(candidate);
  };
  if (is_section) {
    for (std::string_view s : deck_schema::sections()) consider(s);
  } else {
    for (const Key& k : deck_schema::keys()) consider(k.name);
  }
  if (!best.empty()) return best;
  std::string_view leaf = name.substr(name.find('.') + 1);  // all of `name` if it has no dot
  for (const Key& k : deck_schema::keys())
    if (k.leaf() == leaf) return std::string(k.name);
  return "";
}

[[noreturn]] void unknown_key(std::string_view where, std::string_view name, bool is_section) {
  std::string hint = suggestion(name, is_section);
  if (!hint.empty()) hint = fmt::format(" (did you mean '{}'?)", hint);
  if (const Key* key = deck_schema::find(name); is_section && key)  // "model.layers: 8"
    hint = fmt::format(" (keys are nested in the file: '{}:' then '  {}: ...')", key->section(),
                       key->leaf());
  std::string_view section = name.substr(0, name.find('.'));
  const auto& known = deck_schema::sections();
  std::string listing = !is_section && std::find(known.begin(), known.end(), section) != known.end()
                            ? fmt::format("{} keys: {}", section, section_keys(section))
                            : fmt::format("sections: {}", fmt::join(known, ", "));
  input_error("{}: unknown {} '{}'{}; {}", where, is_section ? "section" : "key", name, hint,
              listing);
}

void read_yaml(DeckReader& r, const std::string& text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    input_error("{}: malformed YAML: {}", at_mark(r.label, e.mark), e.msg);
  }
  if (root.IsNull()) return;  // an empty file: every key keeps its default
  if (!root.IsMap())
    input_error("{}: expected a map of sections ({}), got {}", at_mark(r.label, root.Mark()),
                fmt::join(deck_schema::sections(), ", "),
                root.IsScalar() ? yaml_quote(root.Scalar()) : scalar_of(root).non_scalar);

  std::unordered_set<std::string> seen;  // yaml-cpp keeps duplicate map keys; we refuse them
  for (const auto& section_kv : root) {
    const std::string section = section_kv.first.IsScalar() ? section_kv.first.Scalar() : "";
    const std::string where = at_mark(r.label, section_kv.first.Mark());
    const auto& known = deck_schema::sections();
    if (std::find(known.begin(), known.end(), section) == known.end())
      unknown_key(where, section, /*is_section=*/true);
    if (!seen.insert(section).second) input_error("{}: section '{}' appears twice", where, section);

    const YAML::Node& body = section_kv.second;
    if (body.IsNull()) continue;  // "model:" with every key commented out
    if (!body.IsMap())
      input_error("{}: expected a map of keys ({}), got {}",
                  deck_schema::subject(at_mark(r.label, body.Mark()), section),
                  section_keys(section),
                  body.IsScalar() ? yaml_quote(body.Scalar()) : scalar_of(body).non_scalar);
    // A nested map ("moe:" in model) holds the keys named section.group.leaf.
    std::vector<std::pair<std::string, std::pair<YAML::Node, YAML::Node>>> entries;
    for (const auto& kv : body) {
      const std::string name = section + "." + (kv.first.IsScalar() ? kv.first.Scalar() : "");
      if (kv.second.IsMap() && !deck_schema::find(name) && deck_schema::is_group(name)) {
        for (const auto& sub : kv.second)
          entries.push_back({name + "." + (sub.first.IsScalar() ? sub.first.Scalar() : ""),
                             {sub.first, sub.second}});
        continue;
      }
      entries.push_back({name, {kv.first, kv.second}});
    }
    for (const auto& [name, pair] : entries) {
      const auto& kv = pair;
      const std::string key_at = at_mark(r.label, kv.first.Mark());
      const Key* key = deck_schema::find(name);
      if (!key) unknown_key(key_at, name, /*is_section=*/false);
      if (!seen.insert(name).second) input_error("{}: key '{}' appears twice", key_at, name);
      // A null value has no mark of its own; point at its key then.
      std::string value_at = kv.second.IsNull() ? key_at : at_mark(r.label, kv.second.Mark());
      deck_schema::assign(*key, r.deck, scalar_of(kv.second), value_at, base_dir);
      r.origin[deck_schema::index_of(*key)] = value_at;
    }
  }
}

std::string trim(std::string_view s) {
  const char* space = " \t\r\n";
  size_t b = s.find_first_not_of(space);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(space) - b + 1));
}

void apply_override(DeckReader& r, const std::string& item, const std::string& cwd) {
  const size_t eq = item.find('=');
  const std::string name = trim(std::string_view(item).substr(0, eq));
  if (eq == std::string::npos || name.empty()) input_error("--set {}: expected key=value", item);
  const Key* key = deck_schema::find(name);
  if (!key) unknown_key(fmt::format("--set {}", item), name, /*is_section=*/false);
  YAML::Node value;
  try {
    value = YAML::Load(item.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    input_error("{}: cannot read the value as YAML: {}", deck_schema::subject("--set", name),
                e.msg);
  }
  deck_schema::assign(*key, r.deck, scalar_of(value), "--set", cwd);
  r.origin[deck_schema::index_of(*key)] = "--set";
}

// Ranges, then the rules that tie keys together.
void validate(const DeckReader& r) {
  const Deck& d = r.deck;
  for (const Key& k : deck_schema::keys())
    deck_schema::check_range(k, d, r.origin[deck_schema::index_of(k)]);

  if (d.data.train.empty())
    input_error("{}: data.train is required (the training token file)", r.origin_of("data.train"));
  if (d.model.d_model % d.model.heads != 0)
    input_error("{}: model.d_model ({}) must be a multiple of model.heads ({})",
                r.blame({"model.d_model", "model.heads"}), d.model.d_model, d.model.heads);
  // Note [bf16 activations] (src/backend/bf16_ops.cpp): the CPU's bf16 ops exist as the
  // kernels' test twin, slower than its fp32 ones, so a CPU run is refused rather than slowed.
  if (d.run.precision == "bf16") {
    if (d.run.backend != "cuda")
      input_error("{}: run.precision bf16 needs run.backend cuda: the CPU backend computes in "
                  "fp32 (its bf16 ops only emulate the GPU's rounding for tests, and are slower)",
                  r.blame({"run.precision", "run.backend"}));
  }
  {  // comm.emulate_groups: names from a fixed set, each once
    std::set<std::string> seen;
    std::string_view rest = d.comm.emulate_groups;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string name(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      std::erase(name, ' ');
      if (name != "dp" && name != "tp" && name != "cp" && name != "ep")
        input_error("{}: comm.emulate_groups: unknown group \"{}\"; expected a comma-separated "
                    "list of dp, tp, cp and ep",
                    r.origin_of("comm.emulate_groups"), name);
      if (!seen.insert(name).second)
        input_error("{}: comm.emulate_groups names {} twice", r.origin_of("comm.emulate_groups"),
                    name);
    }
  }
  // A checkpoint's shape replaces model.*, so these are checked against it when it is read.
  if (d.model.init_from.empty()) {
    if (d.model.heads % d.parallel.tp != 0)
      input_error("{}: parallel.tp ({}) must divide model.heads ({})",
                  r.blame({"parallel.tp", "model.heads"}), d.parallel.tp, d.model.heads);
    if (d.parallel.pp > d.model.layers)
      input_error("{}: parallel.pp ({}) must be at most model.layers ({}): a stage needs a layer",
                  r.blame({"parallel.pp", "model.layers"}), d.parallel.pp, d.model.layers);
  }
}

Deck read_deck(const std::string& text, const std::string& label, const fs::path& base_dir,
               const std::string& stem, const std::vector<std::string>& overrides) {
  const fs::path cwd = fs::current_path();
  DeckReader r(label);
  read_yaml(r, text, base_dir.string());
  for (const std::string& item : overrides) apply_override(r, item, cwd.string());
  validate(r);
  if (r.deck.run.out_dir.empty()) r.deck.run.out_dir = (cwd / "runs" / stem).string();
  // log.tensorboard: a switch, or a directory under run.out_dir (an absolute one stays).
  std::string& tb = r.deck.log.tensorboard;
  std::string word = tb;
  for (char& c : word) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (word == "false" || word == "no" || word == "off") tb.clear();
  else if (word == "true" || word == "yes" || word == "on") tb = "tensorboard";
  if (!tb.empty()) tb = (fs::path(r.deck.run.out_dir) / tb).lexically_normal().string();
  return r.deck;
}

}  // namespace

bool link_emulated_for(const CommConfig& comm, std::string_view group) {
  if (comm.emulate_gbps <= 0) return false;
  std::string_view rest = comm.emulate_groups;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view name = rest.substr(0, comma);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name == group) return true;
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return false;
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) input_error("{}: cannot read the deck: it is a directory", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) input_error("{}: cannot open the deck file: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  const fs::path file = fs::absolute(path).lexically_normal();
  Deck deck = read_deck(text.str(), path, file.parent_path(), file.stem().string(), overrides);
  deck.source = file.string();
  return deck;
}

Deck parse_deck(const std::string& yaml_text, const std::string& source_dir,
                const std::vector<std::string>& overrides) {
  const fs::path base = fs::absolute(source_dir.empty() ? "." : source_dir).lexically_normal();
  return read_deck(yaml_text, "(deck text)", base, "deck", overrides);
}

std::string Deck::to_yaml() const {
  std::string out =
      "# trident deck, resolved: every key with the value in effect; paths are absolute.\n";
  if (!source.empty()) out += fmt::format("# source: {}\n", source);
  std::string_view section, group;
  for (const Key& k : deck_schema::keys()) {
    if (k.section() != section) {
      section = k.section();
      group = {};
      out += fmt::format("{}:\n", section);
    }
    // A grouped key (model.moe.experts) under its group's line, once.
    std::string_view leaf = k.leaf(), indent = "  ";
    if (const size_t dot = leaf.find('.'); dot != std::string_view::npos) {
      if (leaf.substr(0, dot) != group) out += fmt::format("  {}:\n", leaf.substr(0, dot));
      group = leaf.substr(0, dot);
      leaf = leaf.substr(dot + 1);
      indent = "    ";
    } else {
      group = {};
    }
    std::string line = fmt::format("{}{}: {}", indent, leaf, deck_schema::format_value(k, *this));
    out += fmt::format("{:<40} # {}\n", line, k.help);
  }
  return out;
}

}  // namespace trident
