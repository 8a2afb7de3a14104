#!/usr/bin/env bash
# Prints the Debian archive this machine's apt installs bookworm from (the
# Repo-URI of its own `deb ... bookworm` entry), so that scripts needing an
# archive (debootstrap, a deb-src entry) use the machine's mirror and the
# tree names no host. Exits 1, saying so, when apt has no such entry.
set -euo pipefail
uri=$(apt-get indextargets --format '$(REPO_URI)' 'Release: bookworm' \
  'Target-Of: deb' 'Created-By: Packages' | sort -u | head -1)
if [[ -z "$uri" ]]; then
  echo "debian_archive: apt has no 'deb' entry for bookworm (apt-get indextargets);" \
    "add the Debian 12 archive to /etc/apt/sources.list.d" >&2
  exit 1
fi
echo "${uri%/}"
