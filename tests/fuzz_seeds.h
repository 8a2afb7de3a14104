// What psmd's decoder fuzz targets (hw/frame_fuzz.cc,
// daemon/remote/wire_fuzz.cc; scripts/libfuzzer.sh drives them) share: they
// make their seed corpus themselves, from the encoders and builders they
// test, so the corpus follows the format.
//
// Thread-safety: called once, from LLVMFuzzerInitialize.
#ifndef PSMD_TESTS_FUZZ_SEEDS_H_
#define PSMD_TESTS_FUZZ_SEEDS_H_

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace psmd::fuzz {

// When the environment variable `env` names a directory, writes `seeds()`
// there as seed-00, seed-01, ... and ends the process (target `name`
// says so); otherwise returns.
template <typename MakeSeeds>
void WriteSeedsIfAsked(const char* env, const char* name, MakeSeeds seeds) {
  const char* dir = getenv(env);
  if (dir == nullptr) return;
  int i = 0;
  for (const std::string& seed : seeds()) {
    char file[32];
    snprintf(file, sizeof(file), "/seed-%02d", i++);
    std::ofstream(std::string(dir) + file, std::ios::binary)
        .write(seed.data(), static_cast<std::streamsize>(seed.size()));
  }
  printf("%s: wrote %d seeds to %s\n", name, i, dir);
  exit(0);
}

}  // namespace psmd::fuzz

#endif  // PSMD_TESTS_FUZZ_SEEDS_H_
