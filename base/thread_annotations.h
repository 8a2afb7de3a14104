// Clang's thread-safety annotations, for the daemon and the client alike
// (bazel build --config=thread-safety //daemon/... //client/...): a member
// marked PSMD_GUARDED_BY(mu) may only be touched with `mu` held, a function
// marked PSMD_REQUIRES(mu) only be called so, and the analysis checks every
// function body against that. The capability may be a lock (base/mutex.h)
// or a thread (base/thread_role.h). GCC builds compile the annotations away.
//
// Thread-safety: macros only.
#ifndef PSMD_BASE_THREAD_ANNOTATIONS_H_
#define PSMD_BASE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define PSMD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define PSMD_THREAD_ANNOTATION(x)
#endif

#define PSMD_CAPABILITY(x) PSMD_THREAD_ANNOTATION(capability(x))
#define PSMD_SCOPED_CAPABILITY PSMD_THREAD_ANNOTATION(scoped_lockable)
#define PSMD_GUARDED_BY(x) PSMD_THREAD_ANNOTATION(guarded_by(x))
#define PSMD_PT_GUARDED_BY(x) PSMD_THREAD_ANNOTATION(pt_guarded_by(x))
#define PSMD_REQUIRES(...) \
  PSMD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define PSMD_EXCLUDES(...) PSMD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define PSMD_ACQUIRE(...) \
  PSMD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define PSMD_RELEASE(...) \
  PSMD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define PSMD_ASSERT_CAPABILITY(x) PSMD_THREAD_ANNOTATION(assert_capability(x))
#define PSMD_RETURN_CAPABILITY(x) PSMD_THREAD_ANNOTATION(lock_returned(x))
#define PSMD_NO_THREAD_SAFETY_ANALYSIS \
  PSMD_THREAD_ANNOTATION(no_thread_safety_analysis)

#endif  // PSMD_BASE_THREAD_ANNOTATIONS_H_
