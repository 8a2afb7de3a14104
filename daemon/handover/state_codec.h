// The byte format of what one psmd hands the next (issue 33; docs/design.md,
// "Handover"): fields written one by one, little-endian and fixed-width, in
// tagged sections whose length is written before their body.
//
// The reader treats the bytes as untrusted input, because a successor must
// never misread state written by another version, or damaged on its way:
//   1. Every read is bounds-checked; the first failure is sticky (every later
//      read fails too) and error() names the field and the byte offset.
//   2. A count is checked against the bytes left before anything is
//      allocated for it (Count): a forged count cannot make the reader
//      reserve more than the input's size.
//   3. A section's body is read through its own reader, which cannot read
//      past the section; the outer reader resumes after it whatever the
//      body's reader consumed.
//
// Thread-safety: plain values; one thread uses each.
#ifndef PSMD_DAEMON_HANDOVER_STATE_CODEC_H_
#define PSMD_DAEMON_HANDOVER_STATE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace psmd::handover {

class StateWriter {
 public:
  void U8(uint8_t v) { Put(&v, 1); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  void U16(uint16_t v) { Little(v); }
  void U32(uint32_t v) { Little(v); }
  void U64(uint64_t v) { Little(v); }
  void I32(int32_t v) { U32(static_cast<uint32_t>(v)); }
  // A length-prefixed string, or byte vector (the same layout).
  void Str(const std::string& s) { Bytes(s.data(), s.size()); }
  void Str(const std::vector<uint8_t>& v) { Bytes(v.data(), v.size()); }
  // A fixed-layout value shared with clients (a descriptor: shm/descriptor.h
  // pins their layout with static_asserts), as its bytes.
  template <typename T>
  void Pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put(&v, sizeof(T));
  }

  // A section: its tag, then its body's length (patched by EndSection).
  size_t BeginSection(uint32_t tag) {
    U32(tag);
    const size_t at = bytes_.size();
    U64(0);
    return at;
  }
  void EndSection(size_t at) {
    const uint64_t len = bytes_.size() - at - sizeof(uint64_t);
    for (size_t i = 0; i < sizeof(len); ++i) {
      bytes_[at + i] = static_cast<char>(len >> (8 * i));
    }
  }

  // A whole section whose body another writer wrote.
  void Section(uint32_t tag, const std::string& body) {
    const size_t at = BeginSection(tag);
    Raw(body);
    EndSection(at);
  }
  // Bytes another writer wrote (its sections), as they are.
  void Raw(const std::string& bytes) { Put(bytes.data(), bytes.size()); }

  // Room for `n` bytes in all, so that a large state is not copied as it
  // grows (each copy also touches fresh pages: a page fault each).
  void Reserve(size_t n) { bytes_.reserve(n); }
  const std::string& bytes() const { return bytes_; }
  std::string Take() { return std::move(bytes_); }

 private:
  template <typename T>
  void Little(T v) {
    char b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i)
      b[i] = static_cast<char>(v >> (8 * i));
    Put(b, sizeof(T));
  }
  void Put(const void* p, size_t n) {
    bytes_.append(static_cast<const char*>(p), n);
  }
  void Bytes(const void* p, size_t n) {
    U32(static_cast<uint32_t>(n));
    Put(p, n);
  }

  std::string bytes_;
};

class StateReader {
 public:
  StateReader() = default;
  StateReader(const void* data, size_t size, size_t base_offset = 0)
      : p_(static_cast<const uint8_t*>(data)),
        size_(size),
        base_(base_offset) {}

  bool U8(uint8_t* v, const char* what) { return Get(v, 1, what); }
  bool Bool(bool* v, const char* what) {
    uint8_t b = 0;
    if (!U8(&b, what)) return false;
    if (b > 1) return Fail(what, "is neither 0 nor 1");
    *v = b == 1;
    return true;
  }
  bool U16(uint16_t* v, const char* what) { return Little(v, what); }
  bool U32(uint32_t* v, const char* what) { return Little(v, what); }
  bool U64(uint64_t* v, const char* what) { return Little(v, what); }
  bool I32(int32_t* v, const char* what) {
    uint32_t u = 0;
    if (!U32(&u, what)) return false;
    *v = static_cast<int32_t>(u);
    return true;
  }
  // A string, or byte vector, of at most `max` bytes.
  template <typename Bytes>
  bool Str(Bytes* s, size_t max, const char* what) {
    static_assert(std::is_same_v<Bytes, std::string> ||
                  std::is_same_v<Bytes, std::vector<uint8_t>>);
    uint32_t n = 0;
    if (!U32(&n, what)) return false;
    if (n > max) return Fail(what, "is longer than " + std::to_string(max));
    if (n > Left()) return Fail(what, "runs past the end");
    s->assign(p_ + at_, p_ + at_ + n);
    at_ += n;
    return true;
  }
  template <typename T>
  bool Pod(T* v, const char* what) {
    static_assert(std::is_trivially_copyable_v<T>);
    return Get(v, sizeof(T), what);
  }
  // A count of items of at least `min_each` bytes each, at most `max`
  // (invariant 2).
  bool Count(uint32_t* n, size_t min_each, uint64_t max, const char* what) {
    if (!U32(n, what)) return false;
    if (*n > max) {
      return Fail(what, std::to_string(*n) + " exceeds " + std::to_string(max));
    }
    if (min_each != 0 && *n > Left() / min_each) {
      return Fail(what, std::to_string(*n) + " items cannot fit in the " +
                            std::to_string(Left()) + " bytes left");
    }
    return true;
  }
  // The next section, which must be `tag`: *body reads exactly its bytes
  // (invariant 3).
  bool Section(uint32_t tag, StateReader* body, const char* what) {
    uint32_t got = 0;
    uint64_t len = 0;
    if (!U32(&got, what)) return false;
    if (got != tag) {
      return Fail(what, "tag " + std::to_string(got) + " where " +
                            std::to_string(tag) + " was expected");
    }
    if (!U64(&len, what)) return false;
    if (len > Left()) return Fail(what, "length runs past the end");
    *body = StateReader(p_ + at_, static_cast<size_t>(len), base_ + at_);
    at_ += static_cast<size_t>(len);
    return true;
  }

  // Marks the input bad (invariant 1); always returns false.
  bool Fail(const char* what, const std::string& why) {
    if (error_.empty()) {
      error_ = std::string(what) + " " + why + " (byte " +
               std::to_string(base_ + at_) + ")";
    }
    at_ = size_;
    return false;
  }
  // Adopts a section reader's failure.
  bool Absorb(const StateReader& body) {
    if (body.ok()) return true;
    if (error_.empty()) error_ = body.error_;
    at_ = size_;
    return false;
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t Left() const { return size_ - at_; }
  bool AtEnd() const { return at_ == size_; }

 private:
  template <typename T>
  bool Little(T* v, const char* what) {
    uint8_t b[sizeof(T)] = {};  // (GCC cannot see that Get fills it)
    if (!Get(b, sizeof(T), what)) return false;
    T x = 0;
    for (size_t i = 0; i < sizeof(T); ++i) x |= static_cast<T>(b[i]) << (8 * i);
    *v = x;
    return true;
  }
  bool Get(void* out, size_t n, const char* what) {
    if (!error_.empty()) return false;
    if (n > Left()) return Fail(what, "runs past the end");
    std::memcpy(out, p_ + at_, n);
    at_ += n;
    return true;
  }

  const uint8_t* p_ = nullptr;
  size_t size_ = 0;
  size_t at_ = 0;
  size_t base_ = 0;  // where this reader's bytes start in the whole input
  std::string error_;
};

}  // namespace psmd::handover

#endif  // PSMD_DAEMON_HANDOVER_STATE_CODEC_H_
