// libfabric, loaded when psmd first calls it (fabric = "ofi", psmd
// --fabric-info), not when psmd starts. Debian's libfabric.so.1 links every
// provider's library, libinfinipath among them, whose constructor waits
// about 200 ms for a device this node may not have: every psmd start paid
// it, and so did a handover's blackout (docs/design.md, "Handover"). The
// backend calls five of libfabric's exported functions (the rest of its
// API is inline, through the objects these return); each is defined here
// and forwards to the library's own, bound by name and symbol version on
// first use.
#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <mutex>
#include <string>

namespace {

struct Libfabric {
  decltype(&fi_getinfo) getinfo = nullptr;
  decltype(&fi_freeinfo) freeinfo = nullptr;
  decltype(&fi_dupinfo) dupinfo = nullptr;
  decltype(&fi_fabric) fabric = nullptr;
  decltype(&fi_strerror) strerror = nullptr;
  std::string error;  // why it could not be loaded
};

template <typename F>
void Bind(void* lib, const char* name, const char* version, F* out,
          std::string* error) {
  *out = reinterpret_cast<F>(dlvsym(lib, name, version));
  if (*out == nullptr && error->empty()) {
    *error = std::string("libfabric.so.1 has no ") + name + "@" + version;
  }
}

const Libfabric& Load() {
  static Libfabric lf;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      lf.error = std::string(
                     "cannot load libfabric.so.1 (install Debian's "
                     "libfabric1): ") +
                 dlerror();
      return;
    }
    // The versions psmd was built against (libfabric-dev 1.17).
    Bind(lib, "fi_getinfo", "FABRIC_1.3", &lf.getinfo, &lf.error);
    Bind(lib, "fi_freeinfo", "FABRIC_1.3", &lf.freeinfo, &lf.error);
    Bind(lib, "fi_dupinfo", "FABRIC_1.3", &lf.dupinfo, &lf.error);
    Bind(lib, "fi_fabric", "FABRIC_1.1", &lf.fabric, &lf.error);
    Bind(lib, "fi_strerror", "FABRIC_1.0", &lf.strerror, &lf.error);
    if (!lf.error.empty()) lf = Libfabric{{}, {}, {}, {}, {}, lf.error};
  });
  return lf;
}

}  // namespace

extern "C" {

int fi_getinfo(uint32_t version, const char* node, const char* service,
               uint64_t flags, const struct fi_info* hints,
               struct fi_info** info) {
  const Libfabric& lf = Load();
  if (lf.getinfo == nullptr) return -FI_ENOSYS;
  return lf.getinfo(version, node, service, flags, hints, info);
}

void fi_freeinfo(struct fi_info* info) {
  const Libfabric& lf = Load();
  if (lf.freeinfo != nullptr) lf.freeinfo(info);
}

struct fi_info* fi_dupinfo(const struct fi_info* info) {
  const Libfabric& lf = Load();
  return lf.dupinfo == nullptr ? nullptr : lf.dupinfo(info);
}

int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric,
              void* context) {
  const Libfabric& lf = Load();
  if (lf.fabric == nullptr) return -FI_ENOSYS;
  return lf.fabric(attr, fabric, context);
}

const char* fi_strerror(int errnum) {
  const Libfabric& lf = Load();
  if (lf.strerror == nullptr) return lf.error.c_str();
  return lf.strerror(errnum);
}

}  // extern "C"
