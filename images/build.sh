#!/usr/bin/env bash
# Build the rlkube images from images/<name>.Dockerfile, with buildah (no daemon; root, into the
# podman/buildah store) or Docker (a laptop): `make images`, or
#   images/build.sh [operator] [runtime-cpu] [runtime-gpu]      (default: operator runtime-cpu)
# Tags: $REGISTRY/rlkube-<name>:$TAG (ghcr.io/rlkube, pyproject's version). ENGINE=buildah|docker
# (default: buildah when installed).
#
# Where packages come from is the machine's: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS
# from the environment, else from pip's configuration (`pip config get global.<key>`), passed as
# build arguments (the Dockerfiles default to PyPI and PyTorch's CPU index). Under buildah, local
# ones (file:// indexes, a find-links directory) and the CA bundle are bind-mounted read-only into
# the RUN steps at their own paths; Docker cannot bind them, so it gets remote indexes only.
# When the base image is neither in the store nor pullable (no registry), images/standin-base.sh
# builds a stand-in from Debian's packages under its name (say so where you report on the image).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v buildah >/dev/null && echo buildah || echo docker)}
REGISTRY=${REGISTRY:-ghcr.io/rlkube}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
NICE=(nice -n 10)  # the build shares the machine: pip and layer commits at low priority
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(operator runtime-cpu)

pip_setting() {  # $1: the PIP_* variable; its value from the environment, else pip's configuration
  local key=${1#PIP_}
  key=$(echo "$key" | tr 'A-Z_' 'a-z-')
  if [ -n "${!1:-}" ]; then echo "${!1}"; else python3 -m pip config get "global.$key" 2>/dev/null || true; fi
}

buildah_args=() docker_args=() volumes=()
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS; do
  local_items=() remote_items=()
  for item in $(pip_setting "$var"); do
    path=${item#file://}
    if [ "${path:0:1}" = / ]; then
      local_items+=("$item")
      # a file:// index's pages link to files beside it (../../files/...): bind its parent
      if [ "$(basename "$path")" = simple ]; then path=$(dirname "$path"); fi
      if [ -e "$path" ]; then volumes+=(-v "$path:$path:ro"); fi
    else remote_items+=("$item"); fi
  done
  all="${remote_items[*]} ${local_items[*]}"
  if [ -n "${all// }" ]; then buildah_args+=(--build-arg "$var=$(echo $all)"); fi
  if [ ${#remote_items[@]} -gt 0 ]; then docker_args+=(--build-arg "$var=${remote_items[*]}"); fi
done
cert=/etc/ssl/certs/ca-certificates.crt  # a TLS proxy's CA lives only in the machine's bundle
if [ -f "$cert" ]; then volumes+=(-v "$cert:$cert:ro"); fi

base_present() {
  if [ "$ENGINE" = buildah ]; then buildah inspect --type image "$1" >/dev/null 2>&1
  else docker image inspect "$1" >/dev/null 2>&1; fi
}

standin_stale() {  # a stand-in base made by another version of images/standin-base.sh
  [ "$ENGINE" = buildah ] || return 1
  local labels
  labels=$(buildah inspect --type image --format \
    '{{index .OCIv1.Config.Labels "org.rlkube.standin"}} {{index .OCIv1.Config.Labels "org.rlkube.standin.script"}}' \
    "docker.io/library/$1" 2>/dev/null) || return 1
  [ "${labels%% *}" = debootstrap ] && [ "${labels#* }" != "$(sha256sum images/standin-base.sh | cut -c1-16)" ]
}

ensure_base() {  # $1: a FROM reference
  if standin_stale "$1"; then
    echo "images: the stand-in $1 was made by another images/standin-base.sh; making it again" >&2
    images/standin-base.sh "docker.io/library/$1"
    return
  fi
  base_present "$1" && return
  if [ "$ENGINE" = buildah ]; then
    timeout 120 buildah pull -q "docker.io/library/$1" >/dev/null 2>&1 && return
    echo "images: $1 cannot be pulled here; building a stand-in from Debian packages" >&2
    images/standin-base.sh "docker.io/library/$1"
  fi  # Docker pulls it itself
}

# What an image is built from: its Dockerfile and context (git's hashes of the tracked files). An
# image labelled with the same hash is not rebuilt (CI builds once per machine; BUILD_ALWAYS=1).
context_hash() {
  { git ls-files -s "$1" images pyproject.toml constraints.txt README.md runtime operator
    git diff HEAD -- images pyproject.toml constraints.txt README.md runtime operator
  } | sha256sum | cut -c1-16
}

for name in "${names[@]}"; do
  dockerfile=images/$name.Dockerfile
  [ -f "$dockerfile" ] || { echo "images: no $dockerfile" >&2; exit 2; }
  image=$REGISTRY/rlkube-$name:$TAG
  hash=$(context_hash "$dockerfile")
  if [ "$ENGINE" = buildah ] && [ -z "${BUILD_ALWAYS:-}" ] && [ "$(buildah inspect --type image \
      --format '{{index .OCIv1.Config.Labels "org.rlkube.context"}}' "$image" 2>/dev/null)" = "$hash" ]; then
    echo "images: $image is up to date (context $hash)"
    continue
  fi
  for base in $(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]*\).*/\1/p' "$dockerfile"); do
    case $base in python:*) ensure_base "$base" ;; esac
  done
  start=$(date +%s)
  if [ "$ENGINE" = buildah ]; then
    "${NICE[@]}" buildah bud --layers --pull=never --runtime runc --network host \
      --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
      --label "org.rlkube.context=$hash" "${buildah_args[@]}" "${volumes[@]}" -f "$dockerfile" -t "$image" .
    size=$(buildah images --format '{{.Size}}' "$image")
  else
    DOCKER_BUILDKIT=1 docker build "${docker_args[@]}" -f "$dockerfile" -t "$image" .
    size=$(docker image ls --format '{{.Size}}' "$image")
  fi
  echo "images: $image built in $(( $(date +%s) - start )) s, $size"
done
