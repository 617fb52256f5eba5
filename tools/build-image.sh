#!/usr/bin/env bash
# Builds the controller image from the Dockerfile with buildah (`make image`), with no container
# registry needed: unless BASE_IMAGE is set (e.g. BASE_IMAGE=python:3.11-slim on a machine that
# can pull it), the base is a Debian bookworm root filesystem made from Debian's packages with
# mmdebstrap (Python 3.11 and venv, no docs, no perl), imported as a local image. The base's
# tarball is cached, keyed by its recipe, and the imported image is kept in local storage, so a
# warm build skips both; buildah's layer cache re-uses the dependency layer until pyproject.toml
# changes.
#   cache: $GPU_BINDER_CACHE, else $XDG_CACHE_HOME/gpu-binder, else ~/.cache/gpu-binder
#   IMAGE: the tag to build (default localhost/gpu-binder:<pyproject version>)
#   BASE_IMAGE: the Dockerfile's base (default: the local Debian base)
# Installs buildah and mmdebstrap with apt-get when missing (needs root). Prints the image's
# tag on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${GPU_BINDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-binder}"
version="$(awk -F'"' '$1=="version = "{print $2; exit}' "$repo/pyproject.toml")"
if [ -z "$version" ]; then
  echo "build-image: cannot read the version from $repo/pyproject.toml" >&2; exit 2
fi
image="${IMAGE:-localhost/gpu-binder:$version}"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git -C "$repo" status --porcelain -- Dockerfile pyproject.toml README.md model actors supervisor k8s cli 2>/dev/null)" ]; then
  revision="$revision-dirty"
fi

need=()
command -v buildah >/dev/null 2>&1 || need+=(buildah)
[ -n "${BASE_IMAGE:-}" ] || command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "build-image: ${need[*]} not installed; run: sudo apt-get install -y ${need[*]}" >&2; exit 2
  fi
  echo "build-image: installing ${need[*]} from Debian's packages ..." >&2
  apt-get install -y -q "${need[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${need[@]}" >&2; } || {
    echo "build-image: apt-get install ${need[*]} failed" >&2; exit 3; }
fi

mkdir -p "$cache/image"
# One build at a time per cache (as tools/build-controlplane.sh): a second caller waits.
exec 9>"$cache/image/.build.lock"
if ! flock -n 9; then
  echo "build-image: another image build is running; waiting for it ..." >&2
  flock 9
fi

# The local base: Debian's essential set plus python3 and python3-venv (usr-is-merged stands in
# for usrmerge, which would pull perl; the purge removes what it pulled anyway), without
# /usr/share/{doc,man,info,locale}. Its tag carries a hash of this recipe.
base_recipe=(--variant=essential --include=python3,python3-venv,usr-is-merged
  "--dpkgopt=path-exclude=/usr/share/doc/*" "--dpkgopt=path-include=/usr/share/doc/*/copyright"
  "--dpkgopt=path-exclude=/usr/share/man/*" "--dpkgopt=path-exclude=/usr/share/info/*"
  "--dpkgopt=path-exclude=/usr/share/locale/*"
  '--customize-hook=chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl perl-modules-5.36 libperl5.36 >/dev/null'
  '--customize-hook=rm -rf "$1"/var/cache/* "$1"/var/log/* "$1"/var/lib/apt/lists/*'
  bookworm)
local_base() {
  local key tar tag start
  key="$(printf '%s\n' "${base_recipe[@]}" | sha256sum | cut -c1-12)"
  tar="$cache/image/debian-python-$key.tar"
  tag="localhost/gpu-binder-base:bookworm-$key"
  if buildah inspect --type image "$tag" >/dev/null 2>&1; then
    echo "$tag"; return 0
  fi
  if [ ! -s "$tar" ]; then
    echo "build-image: making the Debian base with mmdebstrap (about a minute) ..." >&2
    start=$SECONDS
    mmdebstrap --quiet "${base_recipe[@]}" "$tar.tmp" >&2 || {
      rm -f "$tar.tmp"; echo "build-image: mmdebstrap failed; are Debian's repositories reachable?" >&2; exit 3; }
    mv "$tar.tmp" "$tar"
    echo "build-image: base made in $((SECONDS-start)) s" >&2
  fi
  local ctr
  ctr="$(buildah from scratch)"
  buildah add --quiet "$ctr" "$tar" / >/dev/null
  buildah config --env PATH=/usr/local/bin:/usr/bin:/bin --cmd /bin/sh "$ctr"
  buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
  echo "build-image: base imported as $tag" >&2
  echo "$tag"
}
base="${BASE_IMAGE:-$(local_base)}"

# pip inside the build trusts the machine's CA bundle (this machine reaches PyPI through a
# TLS-inspecting proxy): mounted read-only, and named by PIP_CERT_FILE.
ca_args=()
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
if [ -f "$ca" ]; then
  ca_args=(--volume "$ca:/run/build-ca.crt:ro" --build-arg PIP_CERT_FILE=/run/build-ca.crt)
fi

echo "build-image: building $image from $base ..." >&2
start=$SECONDS
# The labels once more as --label: buildah's layer cache (1.28) re-uses the Dockerfile's LABEL
# step when only a build argument changed, which would keep a previous revision's label.
buildah bud --quiet --isolation chroot --layers "${ca_args[@]}" \
  --build-arg "BASE_IMAGE=$base" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  -f "$repo/Dockerfile" -t "$image" "$repo" >&2 || {
  echo "build-image: buildah bud failed (see above); is PyPI reachable?" >&2; exit 3; }
size="$(buildah images --format '{{.Size}}' "$image" | head -1)"
echo "build-image: $image built in $((SECONDS-start)) s, $size" >&2
echo "$image"
