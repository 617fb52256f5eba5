#!/usr/bin/env bash
# Builds the controller image from the Dockerfile with buildah (`make image`), with no container
# registry needed: unless BASE_IMAGE is set (e.g. BASE_IMAGE=python:3.11-slim on a machine that
# can pull it), the base is a Debian bookworm root filesystem made from Debian's packages with
# mmdebstrap (Python 3.11 and venv, no docs, no perl), imported as a local image. The base's
# tarball is cached, keyed by its recipe, and the imported image is kept in local storage, so a
# warm build skips both; buildah's layer cache re-uses the dependency layer until pyproject.toml
# changes.
#   cache: $GPU_BINDER_CACHE, else $XDG_CACHE_HOME/gpu-binder, else ~/.cache/gpu-binder
#   IMAGE: the tag to build (default localhost/gpu-binder:<pyproject version>, and for a
#     GIT_REVISION build localhost/gpu-binder:<its version>-g<12 hex of the commit>: a tag no
#     work tree's build of the same version overwrites)
#   BASE_IMAGE: the Dockerfile's base (default: the local Debian base)
#   GIT_REVISION: build that commit (any git revision: a tag, a hash) instead of the work
#     tree, from `git archive` of it with its own Dockerfile and version (the upgrade tests'
#     previous version: GIT_REVISION=9dfc521 gives localhost/gpu-binder:0.1.0-g9dfc52119057
#     labelled version 0.1.0). The image is
#     kept: a second build of the same commit only checks its revision label. A revision
#     missing from the clone fails (exit 4) naming it.
# Installs buildah and mmdebstrap with apt-get when missing (needs root). Prints the image's
# tag on its last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${GPU_BINDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-binder}"
# The build context: the work tree, or (GIT_REVISION) that commit's tree unpacked in the cache.
src="$repo"
if [ -n "${GIT_REVISION:-}" ]; then
  revision="$(git -C "$repo" rev-parse --verify --quiet "${GIT_REVISION}^{commit}" 2>/dev/null)" || {
    echo "build-image: revision $GIT_REVISION is not in the clone at $repo (a shallow clone?);" \
         "fetch it first, e.g. git -C $repo fetch --unshallow, or git fetch origin $GIT_REVISION" >&2
    exit 4; }
  src="$cache/image/src-$revision"
  if [ ! -f "$src/.unpacked" ]; then
    rm -rf "$src"; mkdir -p "$src"
    git -C "$repo" archive "$revision" | tar -x -C "$src"
    touch "$src/.unpacked"
  fi
fi
version="$(awk -F'"' '$1=="version = "{print $2; exit}' "$src/pyproject.toml")"
if [ -z "$version" ]; then
  echo "build-image: cannot read the version from $src/pyproject.toml" >&2; exit 2
fi
if [ -n "${GIT_REVISION:-}" ]; then
  image="${IMAGE:-localhost/gpu-binder:$version-g${revision:0:12}}"
else
  image="${IMAGE:-localhost/gpu-binder:$version}"
fi
if [ -z "${GIT_REVISION:-}" ]; then
  revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ "$revision" != unknown ] && [ -n "$(git -C "$repo" status --porcelain -- Dockerfile pyproject.toml README.md model actors supervisor k8s cli 2>/dev/null)" ]; then
    revision="$revision-dirty"
  fi
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

# The local base: Debian's essential set plus python3, python3-venv and libstdc++6 (the CEL
# runtime of cel-expr-python, device mode's selectors, is C++; usr-is-merged stands in
# for usrmerge, which would pull perl; the purge removes what it pulled anyway), without
# /usr/share/{doc,man,info,locale}. Its tag carries a hash of this recipe.
base_recipe=(--variant=essential --include=python3,python3-venv,libstdc++6,usr-is-merged
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
# A commit's image is built once: kept while its tag carries that commit's revision label.
if [ -n "${GIT_REVISION:-}" ] && [ "$(buildah inspect --type image \
    --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.revision"}}' "$image" \
    2>/dev/null)" = "$revision" ]; then
  echo "build-image: $image of $revision already built" >&2
  echo "$image"; exit 0
fi
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
  -f "$src/Dockerfile" -t "$image" "$src" >&2 || {
  echo "build-image: buildah bud failed (see above); is PyPI reachable?" >&2; exit 3; }
size="$(buildah images --format '{{.Size}}' "$image" | head -1)"
echo "build-image: $image built in $((SECONDS-start)) s, $size" >&2
echo "$image"
