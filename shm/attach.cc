#include "shm/attach.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace psmd::shm {

bool SendWithFds(int sock, const void* data, size_t len, const int* fds,
                 int nfds) {
  struct iovec iov;
  iov.iov_base = const_cast<void*>(data);
  iov.iov_len = len;
  alignas(
      struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kAttachFdCount)];
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (nfds > 0) {
    if (nfds > kAttachFdCount) return false;
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(cmsg), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(len);
}

bool RecvWithFds(int sock, void* data, size_t len, int* fds, int max_fds,
                 int* nfds) {
  *nfds = 0;
  size_t got = 0;
  while (got < len) {
    struct iovec iov;
    iov.iov_base = static_cast<char*>(data) + got;
    iov.iov_len = len - got;
    alignas(
        struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * kAttachFdCount)];
    struct msghdr msg {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      const int* incoming = reinterpret_cast<const int*>(CMSG_DATA(c));
      for (int i = 0; i < count; i++) {
        if (*nfds < max_fds) {
          fds[(*nfds)++] = incoming[i];
        } else {
          close(incoming[i]);
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) break;
    got += static_cast<size_t>(n);
  }
  if (got == len) return true;
  for (int i = 0; i < *nfds; i++) close(fds[i]);
  *nfds = 0;
  return false;
}

}  // namespace psmd::shm
