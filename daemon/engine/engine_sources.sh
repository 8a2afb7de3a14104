# The daemon sources an engine fuzz target links, outside Bazel's gcc
# toolchain, and the flags they need (the spdlog defines are
# third_party/system:spdlog's): sourced from the repository's root by
# daemon/engine/engine_fuzz.sh, engine_state_fuzz.sh and engine_fuzz_lib.sh.
engine_sources=(
  daemon/engine/mq_engine.cc daemon/engine/across_shards.cc
  daemon/engine/engine_state.cc daemon/engine/crossing.cc
  daemon/engine/fabric_across.cc
  daemon/engine/validate.cc daemon/engine/endpoint.cc
  daemon/engine/cross_copy.cc daemon/log.cc shm/mapping.cc shm/segment.cc
)
engine_flags=(
  -Iinclude -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL
)
engine_libs=(-lspdlog -lfmt -lsystemd -pthread)
# What a target links them as: the sources, or under Bazel the archive
# engine_fuzz_lib.sh compiled them into once for both targets
# (ENGINE_FUZZ_LIB; each compile took longer than its run). Whole: an
# archive's members nothing names yet would be left out.
if [ -n "${ENGINE_FUZZ_LIB:-}" ]; then
  engine_objects=(-Wl,--whole-archive "$ENGINE_FUZZ_LIB" -Wl,--no-whole-archive)
else
  engine_objects=("${engine_sources[@]}")
fi
