#include "shm/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace psmd::shm {

Mapping::~Mapping() { Reset(); }

Mapping::Mapping(Mapping&& other) noexcept { *this = std::move(other); }

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::exchange(other.fd_, -1);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void Mapping::Reset() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  base_ = nullptr;
  size_ = 0;
}

static std::string Errno(const char* what) {
  return std::string(what) + ": " + strerror(errno);
}

bool Mapping::Map(uint64_t bytes, Mapping* out, std::string* error) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base == MAP_FAILED) {
    *error = Errno("mmap");
    return false;
  }
  base_ = static_cast<uint8_t*>(base);
  size_ = bytes;
  *out = std::move(*this);
  return true;
}

bool Mapping::Create(const std::string& name, uint64_t bytes, uid_t uid,
                     gid_t gid, Mapping* out, std::string* error) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = Errno("memfd_create");
    return false;
  }
  Mapping m;
  m.fd_ = fd;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    *error = Errno("ftruncate");
    return false;
  }
  if (fchmod(fd, 0600) != 0) {
    *error = Errno("fchmod");
    return false;
  }
  if (geteuid() == 0 && fchown(fd, uid, gid) != 0) {
    *error = Errno("fchown");
    return false;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    *error = Errno("F_ADD_SEALS");
    return false;
  }
  return m.Map(bytes, out, error);
}

bool Mapping::Attach(int fd, uint64_t bytes, Mapping* out, std::string* error) {
  Mapping m;
  m.fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *error = Errno("fstat");
    return false;
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    *error = "segment size " + std::to_string(st.st_size) +
             " differs from announced " + std::to_string(bytes);
    return false;
  }
  return m.Map(bytes, out, error);
}

}  // namespace psmd::shm
