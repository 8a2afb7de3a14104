// matcher_reference.h: obviously-correct linear models of PostedQueue and
// UnexpectedQueue (matcher.h), for differential tests and as the benchmark
// baseline. Same API; every lookup scans a std::deque in insertion order, so
// "earliest matching" is simply "first matching". Not thread-safe.

#ifndef PSMD_DAEMON_ENGINE_MATCHER_REFERENCE_H_
#define PSMD_DAEMON_ENGINE_MATCHER_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <utility>

#include "daemon/engine/tag.h"

namespace psmd {

template <typename RecvT>
class LinearPostedQueue {
 public:
  void post(const RecvPattern& p, RecvT value, uint64_t id = 0) {
    entries_.push_back(Entry{p, id, std::move(value)});
  }

  std::optional<RecvT> take_match(const MsgKey& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (matches(it->pattern, key)) return erase(it);
    }
    return std::nullopt;
  }

  template <typename Pred>
  std::optional<RecvT> remove_first_if(Pred pred) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (pred(std::as_const(it->value))) return erase(it);
    }
    return std::nullopt;
  }

  template <typename Pred, typename F>
  void remove_all_if(Pred pred, F f) {
    while (auto v = remove_first_if(pred)) f(std::move(*v));
  }

  std::optional<RecvT> remove_id(uint64_t id) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->id == id) return erase(it);
    }
    return std::nullopt;
  }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  template <typename F>
  void drain(F&& f) {
    std::deque<Entry> entries = std::move(entries_);
    entries_.clear();
    for (Entry& e : entries) f(std::move(e.value));
  }

  void clear() { entries_.clear(); }

 private:
  struct Entry {
    RecvPattern pattern;
    uint64_t id;
    RecvT value;
  };

  template <typename It>
  RecvT erase(It it) {
    RecvT v = std::move(it->value);
    entries_.erase(it);
    return v;
  }

  std::deque<Entry> entries_;  // posting order
};

template <typename MsgT>
class LinearUnexpectedQueue {
 public:
  void push(const MsgKey& key, MsgT value) {
    entries_.push_back(Entry{key, std::move(value)});
  }

  MsgT* find(const RecvPattern& p, MsgKey* key_out = nullptr) {
    for (Entry& e : entries_) {
      if (matches(p, e.key)) {
        if (key_out != nullptr) *key_out = e.key;
        return &e.value;
      }
    }
    return nullptr;
  }

  std::optional<MsgT> take(const RecvPattern& p, MsgKey* key_out = nullptr) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (matches(p, it->key)) {
        if (key_out != nullptr) *key_out = it->key;
        return erase(it);
      }
    }
    return std::nullopt;
  }

  template <typename Pred>
  std::optional<MsgT> remove_first_if(Pred pred) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (pred(std::as_const(it->value))) return erase(it);
    }
    return std::nullopt;
  }

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

  template <typename F>
  void drain(F&& f) {
    std::deque<Entry> entries = std::move(entries_);
    entries_.clear();
    for (Entry& e : entries) f(std::as_const(e.key), std::move(e.value));
  }

 private:
  struct Entry {
    MsgKey key;
    MsgT value;
  };

  template <typename It>
  MsgT erase(It it) {
    MsgT v = std::move(it->value);
    entries_.erase(it);
    return v;
  }

  std::deque<Entry> entries_;  // arrival order
};

}  // namespace psmd

#endif  // PSMD_DAEMON_ENGINE_MATCHER_REFERENCE_H_
