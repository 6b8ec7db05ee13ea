// WebDataset: samples = runs of tar members sharing a key, by webdataset's
// rules (base_plus_ext, group_by_keys), read one shard at a time.
#include <spindle/sources.hpp>

#include <cctype>
#include <stdexcept>

namespace spindle {
namespace {

// A minimal JSON reader: enough to find the top-level "label" of a sample's
// .json member and to refuse malformed text; everything else is skipped.
class JsonLabel {
 public:
  JsonLabel(const std::vector<std::byte>& text, const std::string& origin)
      : p_(reinterpret_cast<const char*>(text.data())), n_(text.size()), origin_(origin) {}

  int64_t find() {
    ws();
    if (peek() != '{') bad("the top level is not an object");
    ++i_;
    int64_t label = -1;
    ws();
    if (peek() == '}') return label;
    while (true) {
      ws();
      const std::size_t key_at = i_;
      skip_string();
      const bool is_label = i_ - key_at == 7 && std::string(p_ + key_at, 7) == "\"label\"";
      ws();
      if (peek() != ':') bad("expected ':'");
      ++i_;
      ws();
      if (is_label) label = integer();
      else skip_value(0);
      ws();
      if (peek() == ',') { ++i_; continue; }
      if (peek() == '}') { ++i_; break; }
      bad("expected ',' or '}'");
    }
    ws();
    if (i_ != n_) bad("text after the object");
    return label;
  }

 private:
  char peek() const { return i_ < n_ ? p_[i_] : '\0'; }
  void ws() {
    while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\t' || p_[i_] == '\n' || p_[i_] == '\r')) ++i_;
  }
  void skip_string() {
    if (peek() != '"') bad("expected a string");
    for (++i_; i_ < n_; ++i_) {
      if (p_[i_] == '\\') ++i_;
      else if (p_[i_] == '"') { ++i_; return; }
    }
    bad("unterminated string");
  }
  void skip_value(int depth) {
    if (depth > 64) bad("nested over 64 deep");
    const char c = peek();
    if (c == '"') return skip_string();
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      ws();
      if (peek() == close) { ++i_; return; }
      while (true) {
        ws();
        if (c == '{') {
          skip_string();
          ws();
          if (peek() != ':') bad("expected ':'");
          ++i_;
          ws();
        }
        skip_value(depth + 1);
        ws();
        if (peek() == ',') { ++i_; continue; }
        if (peek() == close) { ++i_; return; }
        bad("expected ',' or a closing bracket");
      }
    }
    // A number or true/false/null: a run of their characters.
    const std::size_t start = i_;
    while (i_ < n_ && (std::isalnum(static_cast<unsigned char>(p_[i_])) || p_[i_] == '-' || p_[i_] == '+' || p_[i_] == '.'))
      ++i_;
    if (i_ == start) bad("expected a value");
  }
  int64_t integer() {
    const std::size_t start = i_;
    const bool neg = peek() == '-';
    if (neg) ++i_;
    uint64_t v = 0;
    std::size_t digits = 0;
    while (i_ < n_ && p_[i_] >= '0' && p_[i_] <= '9') {
      if (v > (static_cast<uint64_t>(INT64_MAX) - 9) / 10) bad("\"label\" overflows int64");
      v = v * 10 + static_cast<uint64_t>(p_[i_++] - '0');
      ++digits;
    }
    if (digits == 0 || peek() == '.' || peek() == 'e' || peek() == 'E')
      bad("\"label\" is not an integer: " + std::string(p_ + start, std::min<std::size_t>(n_ - start, 24)));
    return neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  }
  [[noreturn]] void bad(const std::string& what) const {
    throw DataError("WebDataset sample " + origin_ + ": its .json member is not usable: " + what +
                    " (at byte " + std::to_string(i_) + ")");
  }

  const char* p_;
  std::size_t n_;
  const std::string& origin_;
  std::size_t i_ = 0;
};

int64_t parse_cls(const std::vector<std::byte>& bytes, const std::string& origin) {
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::size_t i = 0, j = text.size();
  while (i < j && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  while (j > i && std::isspace(static_cast<unsigned char>(text[j - 1]))) --j;
  bool neg = false;
  if (i < j && (text[i] == '-' || text[i] == '+')) neg = text[i++] == '-';
  if (i == j || j - i > 18) goto bad;
  {
    int64_t v = 0;
    for (std::size_t k = i; k < j; ++k) {
      if (text[k] < '0' || text[k] > '9') goto bad;
      v = v * 10 + (text[k] - '0');
    }
    return neg ? -v : v;
  }
bad:
  throw DataError("WebDataset sample " + origin + ": its .cls member is not a decimal integer: '" +
                  text.substr(0, 32) + "'");
}

}  // namespace

bool WebDataset::split_key(const std::string& name, std::string& key, std::string& field) {
  // webdataset's base_plus_ext: ^((?:.*/|)[^.]+)[.]([^/]*)$ . The field has
  // no '/', so its dot is the first one after the last slash; the key before
  // it must be non-empty and free of dots since the last slash, except that a
  // basename starting with a dot may borrow the directory as its key when the
  // directory's last component has no dot (what the regex backtracks to).
  const std::size_t last_slash = name.rfind('/');
  const std::size_t base = last_slash == std::string::npos ? 0 : last_slash + 1;
  const std::size_t dot = name.find('.', base);
  if (dot == std::string::npos) return false;
  if (dot == base) {
    if (last_slash == std::string::npos) return false;
    const std::size_t prev = last_slash == 0 ? std::string::npos : name.rfind('/', last_slash - 1);
    const std::size_t from = prev == std::string::npos ? 0 : prev + 1;
    if (name.find('.', from) < last_slash) return false;
  }
  key = name.substr(0, dot);
  field = name.substr(dot + 1);
  for (char& c : field)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return true;
}

WebDataset::WebDataset(std::vector<std::string> shards, ShardOptions options) : options_(std::move(options)) {
  for (const std::string& spec : shards)
    for (std::string& url : expand_shard_urls(spec)) shards_.push_back(std::move(url));
  if (shards_.empty()) throw std::invalid_argument("WebDataset: no shards given");
}

std::vector<std::size_t> WebDataset::shards_of_worker(std::size_t worker, std::size_t num_workers) const {
  if (num_workers == 0 || worker >= num_workers)
    throw std::invalid_argument("WebDataset: worker " + std::to_string(worker) + " of " +
                                std::to_string(num_workers));
  std::vector<std::size_t> out;
  for (std::size_t s = worker; s < shards_.size(); s += num_workers) out.push_back(s);
  return out;
}

void WebDataset::for_each_in_shard(std::size_t s, const std::function<bool(WdsSample&&)>& visit) const {
  WdsShardReader reader(*this, s);
  while (auto sample = reader.next())
    if (!visit(std::move(*sample))) return;
}

int64_t WebDataset::label_of(const WdsSample& sample) {
  if (auto it = sample.fields.find("cls"); it != sample.fields.end()) return parse_cls(it->second, sample.origin);
  if (auto it = sample.fields.find("json"); it != sample.fields.end())
    return JsonLabel(it->second, sample.origin).find();
  return -1;
}

namespace {
const std::string& shard_path(const WebDataset& ds, std::size_t s) {
  if (s >= ds.num_shards())
    throw std::out_of_range("WebDataset: shard " + std::to_string(s) + " out of range for " +
                            std::to_string(ds.num_shards()) + " shards");
  return ds.shards()[s];
}
}  // namespace

WdsShardReader::WdsShardReader(const WebDataset& ds, std::size_t shard)
    : shard_(shard_path(ds, shard)), tar_(open_shard(shard_, ds.options())) {}

std::optional<WdsSample> WdsShardReader::next() {
  if (ended_ && !pending_) return std::nullopt;
  WdsSample sample;
  bool have = false;
  std::string key, field;
  while (true) {
    std::optional<TarMember> m;
    if (pending_) m.swap(pending_);
    else if (!ended_) m = tar_.next();
    if (!m) {
      ended_ = true;
      break;
    }
    // Top-level "__*__" members are shard metadata, not samples (webdataset's meta_prefix/suffix).
    if (m->name.find('/') == std::string::npos && m->name.starts_with("__") &&
        m->name.ends_with("__"))
      continue;
    if (!WebDataset::split_key(m->name, key, field)) continue;
    if (!have) {
      sample.key = key;
      sample.origin = shard_ + ":" + key;
      have = true;
    } else if (key != sample.key) {
      pending_ = std::move(m);
      break;
    }
    if (sample.fields.count(field))
      throw DataError("WebDataset shard '" + shard_ + "': member '" + m->name + "' at byte offset " +
                      std::to_string(m->offset) + " repeats field '" + field + "' of sample '" + key +
                      "' (each key may have each extension once)",
                      shard_, key);
    sample.fields.emplace(field, std::move(m->data));
  }
  if (!have) return std::nullopt;
  return sample;
}

}  // namespace spindle
