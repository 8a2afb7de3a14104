// The version of this build of psmd: the release number from the VERSION
// file and the git commit it was built from ("unknown" outside a checkout,
// with "-dirty" when the tree had uncommitted changes). Thread-safe: both
// return static strings.
#ifndef PSMD_VERSION_VERSION_H_
#define PSMD_VERSION_VERSION_H_

namespace psmd::version {

const char* Version();  // e.g. "0.6.0"
const char* Commit();   // e.g. "f5ec8ed1a2b3"

}  // namespace psmd::version

#endif  // PSMD_VERSION_VERSION_H_
