// RAII owner of a shared memory file (memfd) and its mapping.
//
// Thread-safety: not thread-safe; move-only value type.
#ifndef PSMD_SHM_MAPPING_H_
#define PSMD_SHM_MAPPING_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace psmd::shm {

class Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Creates an anonymous memfd of `bytes` (sparse: pages cost memory only
  // when touched), owned by uid/gid with mode 0600, sealed so nobody can
  // shrink it under a mapping (which would SIGBUS the daemon), and maps it.
  // Returns false and fills *error on failure.
  static bool Create(const std::string& name, uint64_t bytes, uid_t uid,
                     gid_t gid, Mapping* out, std::string* error);

  // Maps a received fd after checking that it is a file of exactly `bytes`.
  // Takes ownership of fd either way.
  static bool Attach(int fd, uint64_t bytes, Mapping* out, std::string* error);

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  void Reset();
  // Maps fd_ shared read-write and moves *this into *out.
  bool Map(uint64_t bytes, Mapping* out, std::string* error);

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace psmd::shm

#endif  // PSMD_SHM_MAPPING_H_
