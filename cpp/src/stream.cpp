#include "stream.hpp"

#include <algorithm>
#include <utility>

#include "json.hpp"

namespace dllm::detail {

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string Chunk::to_json(int index) const {
  std::string o = "{\"index\": " + std::to_string(index) + ", \"delta\": ";
  append_json_string(o, delta);
  o += ", \"token_ids\": [";
  for (size_t i = 0; i < token_ids.size(); ++i) o += (i ? ", " : "") + std::to_string(token_ids[i]);
  o += "], \"forwards\": " + std::to_string(forwards) + ", \"tokens\": " + std::to_string(tokens);
  o += ", \"finish_reason\": ";
  if (finish_reason)
    append_json_string(o, finish_reason);
  else
    o += "null";
  return o + "}";
}

RowStream::RowStream(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t budget, int64_t eos_id)
    : RowStream(tokenizer, std::move(stop), budget, std::vector<int64_t>{eos_id}) {}

RowStream::RowStream(const Tokenizer& tokenizer, std::vector<std::string> stop, int64_t budget,
                     std::vector<int64_t> eos_ids)
    : tokenizer_(&tokenizer), stop_(std::move(stop)), budget_(budget), eos_ids_(std::move(eos_ids)) {}

bool RowStream::is_eos(int64_t id) const { return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end(); }

// Held back while the row goes on: a trailing U+FFFD (an incomplete UTF-8 sequence may complete
// with the next token), then the longest trailing part that is a proper prefix of a stop string.
// Both texts are valid UTF-8, so a byte-wise match falls on character boundaries.
std::string RowStream::held_back(const std::string& text) const {
  std::string t = ends_with(text, kReplacement) ? text.substr(0, text.size() - kReplacement.size()) : text;
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t len = s.empty() ? 0 : std::min(s.size() - 1, t.size()); len > hold; --len)
      if (t.compare(t.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  t.resize(t.size() - hold);
  return t;
}

size_t RowStream::stop_cut(const std::string& text) const {
  size_t cut = std::string::npos;
  for (const std::string& s : stop_)
    if (!s.empty()) cut = std::min(cut, text.find(s));
  return cut;
}

// The largest count n in [released ids, n_max] whose decoded text is a prefix of `text` (the ids
// whose text lies wholly within it); the released count when none is.
size_t RowStream::ids_within(const std::vector<int64_t>& ids, size_t n_max, const std::string& text) const {
  for (size_t n = n_max; n > ids_.size(); --n) {
    const std::string t = tokenizer_->decode(std::vector<int64_t>(ids.begin(), ids.begin() + static_cast<long>(n)));
    if (t.size() <= text.size() && text.compare(0, t.size(), t) == 0) return n;
  }
  return ids_.size();
}

bool RowStream::report(const std::vector<int64_t>& ids, int64_t forwards, Chunk* out, bool always) {
  if (reason_) return false;
  final_ = ids;
  const auto eos = std::find_if(final_.begin(), final_.end(), [this](int64_t id) { return is_eos(id); });
  if (eos != final_.end()) final_.erase(eos + 1, final_.end());
  if (static_cast<int64_t>(final_.size()) > budget_) final_.resize(static_cast<size_t>(budget_));
  // no new id: no chunk, unless set_budget lowered the budget to the ids reported (the last, "length")
  if (final_.size() <= reported_ && static_cast<int64_t>(final_.size()) < budget_ && !always) return false;
  reported_ = final_.size();

  const std::string text = tokenizer_->decode(final_);
  std::string released;
  size_t n = final_.size();
  if (const size_t cut = stop_cut(text); cut != std::string::npos) {
    reason_ = "stop";
    released = text.substr(0, cut);
    n = ids_within(final_, final_.size(), released);
  } else if (std::any_of(final_.begin(), final_.end(), [this](int64_t id) { return is_eos(id); })) {
    reason_ = "eos";
    released = text;
  } else if (static_cast<int64_t>(final_.size()) >= budget_) {
    reason_ = "length";
    released = text;
  } else {
    released = held_back(text);
    n = ids_within(final_, final_.size(), released);
  }
  out->delta = released.size() > text_.size() ? released.substr(text_.size()) : std::string();
  out->token_ids.assign(final_.begin() + static_cast<long>(ids_.size()), final_.begin() + static_cast<long>(n));
  text_ += out->delta;
  ids_.insert(ids_.end(), out->token_ids.begin(), out->token_ids.end());
  out->forwards = forwards;
  out->tokens = static_cast<int64_t>(ids_.size());
  out->finish_reason = reason_;
  return true;
}

}  // namespace dllm::detail
