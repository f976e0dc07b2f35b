#!/usr/bin/env bash
# Install the Debian/Ubuntu packages the tests need (.ci/apt-packages.txt), once.
# Nothing to do when they are all installed. As root, or with sudo that needs no password, it
# installs them; otherwise it stops with the one command to run. Called by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

list=${NODECERT_APT_PACKAGES:-.ci/apt-packages.txt}
[[ -r "$list" ]] || { echo "error: cannot read the package list $list" >&2; exit 2; }
mapfile -t wanted < <(grep -v "^\s*#" "$list" | xargs -n1)
missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null; then
  echo "error: the tests need ${missing[*]} and this machine has no apt-get (Debian/Ubuntu only)" >&2
  exit 2
fi
if [[ $(id -u) -eq 0 ]]; then
  sudo=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "error: the tests need system packages that are not installed: ${missing[*]}; run:" \
       "sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 2
fi
echo "installing system packages for the tests: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
