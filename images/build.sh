#!/usr/bin/env bash
# Build the rlkube images from images/<name>.Dockerfile, with buildah (no daemon; root, into the
# podman/buildah store) or Docker (a laptop), and push them: `make images`, `make push REGISTRY=…`, or
#   images/build.sh [--dry-run] [--push DEST] [operator] [runtime-cpu] [runtime-gpu]
# (default: operator runtime-cpu). Each image is tagged $IMAGE_REGISTRY/rlkube-<name>:$TAG (the
# pyproject version; IMAGE_REGISTRY defaults to ghcr.io/rlkube, the chart's image.registry) and
# :$COMMIT (git's short commit, `-dirty` with uncommitted changes to the context). --push DEST
# pushes both tags to DEST/rlkube-<name> (a registry path such as registry.example.com/ml; under
# buildah also a local `dir:PATH` or `oci:PATH`, each tag then PATH/rlkube-<name>-<tag>), and
# refuses a dirty tree. --dry-run prints the engine commands (and the pip.conf) it would run.
# ENGINE=buildah|docker (default: buildah when installed).
#
# Where packages come from is the machine's: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and PIP_FIND_LINKS
# from the environment, else from pip's configuration (`pip config get global.<key>`), else the
# image's default (PyPI; PyTorch's CPU index for runtime-cpu). They reach pip as a pip.conf build
# secret (`--secret id=pip.conf`, mounted at /etc/pip.conf in the RUN steps that install), never a
# build argument, so no index path is recorded in the image's history. Under buildah, local ones
# (file:// indexes, a find-links directory) and the CA bundle are bind-mounted read-only into the
# RUN steps at their own paths; Docker cannot bind them, so it gets remote indexes only.
# When the base image is neither in the store nor pullable (no registry), images/standin-base.sh
# builds a stand-in from Debian's packages under its name (say so where you report on the image).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v buildah >/dev/null && echo buildah || echo docker)}
IMAGE_REGISTRY=${IMAGE_REGISTRY:-ghcr.io/rlkube}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)}
CONTEXT=(images pyproject.toml constraints.txt README.md runtime operator)
COMMIT=${COMMIT:-$(git rev-parse --short=12 HEAD)$([ -z "$(git status --porcelain -- "${CONTEXT[@]}")" ] || echo -dirty)}
NICE=(nice -n 10)  # the build shares the machine: pip and layer commits at low priority
dry_run='' push_to='' names=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --push) [ -n "${2:-}" ] || { echo "images: --push needs a destination (make push REGISTRY=registry.example.com/path)" >&2; exit 2; }
            push_to=${2%/}; shift ;;
    -*) echo "images: unknown option $1" >&2; exit 2 ;;
    *) names+=("$1") ;;
  esac
  shift
done
[ ${#names[@]} -gt 0 ] || names=(operator runtime-cpu)
if [ -n "$push_to" ] && [ "${COMMIT%-dirty}" != "$COMMIT" ]; then
  echo "images: uncommitted changes to the images' context; commit them before pushing (tag $COMMIT)" >&2
  exit 2
fi

run() {  # an engine command, or with --dry-run the command as a shell would read it
  if [ -n "$dry_run" ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi
}

pip_setting() {  # $1: the PIP_* variable; its value from the environment, else pip's configuration
  local key=${1#PIP_}
  key=$(echo "$key" | tr 'A-Z_' 'a-z-')
  if [ -n "${!1:-}" ]; then echo "${!1}"; else python3 -m pip config get "global.$key" 2>/dev/null || true; fi
}

pip_default() {  # $1: image name, $2: the PIP_* variable; what its Dockerfile's pip used by default
  case $2 in
    PIP_INDEX_URL) echo https://pypi.org/simple ;;
    PIP_EXTRA_INDEX_URL) [ "$1" != runtime-cpu ] || echo https://download.pytorch.org/whl/cpu ;;
  esac
}

# The machine's settings: all of them for buildah (local ones bind-mounted), remote ones for Docker.
declare -A buildah_pip docker_pip
volumes=()
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
  buildah_pip[$var]=$(echo $all)
  docker_pip[$var]="${remote_items[*]}"
done

pip_conf() {  # $1: image name: the pip.conf its install steps read, the machine's settings or the defaults
  local var key value
  echo "[global]"
  for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_FIND_LINKS; do
    if [ "$ENGINE" = buildah ]; then value=${buildah_pip[$var]}; else value=${docker_pip[$var]}; fi
    value=${value:-$(pip_default "$1" "$var")}
    key=$(echo "${var#PIP_}" | tr 'A-Z_' 'a-z-')
    if [ -n "$value" ]; then echo "$key = $value"; fi
  done
}
secrets=$(mktemp -d)
trap 'rm -rf "$secrets"' EXIT
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
  { git ls-files -s "$1" "${CONTEXT[@]}"
    git diff HEAD -- "${CONTEXT[@]}"
  } | sha256sum | cut -c1-16
}

push() {  # $1: the built image, $2: name, $3: tag
  local dest
  case $push_to in
    dir:*|oci:*) dest=$push_to/rlkube-$2-$3 ;;
    *) dest=docker://$push_to/rlkube-$2:$3 ;;
  esac
  if [ "$ENGINE" = buildah ]; then run buildah push "$1" "$dest"
  elif [ "${dest#docker://}" != "$dest" ]; then run docker tag "$1" "${dest#docker://}" && run docker push "${dest#docker://}"
  else echo "images: Docker pushes to a registry only, not $push_to" >&2; exit 2; fi
}

for name in "${names[@]}"; do
  dockerfile=images/$name.Dockerfile
  [ -f "$dockerfile" ] || { echo "images: no $dockerfile" >&2; exit 2; }
  image=$IMAGE_REGISTRY/rlkube-$name:$TAG
  tags=(-t "$image" -t "$IMAGE_REGISTRY/rlkube-$name:$COMMIT")
  hash=$(context_hash "$dockerfile")
  pip_conf "$name" > "$secrets/$name.pip.conf"
  secret=(--secret "id=pip.conf,src=$secrets/$name.pip.conf")
  if [ -n "$dry_run" ]; then
    echo "# pip.conf of $name:"; sed 's/^/#   /' "$secrets/$name.pip.conf"
  elif [ "$ENGINE" = buildah ] && [ -z "${BUILD_ALWAYS:-}" ] && [ "$(buildah inspect --type image \
      --format '{{index .OCIv1.Config.Labels "org.rlkube.context"}}' "$image" 2>/dev/null)" = "$hash" ]; then
    echo "images: $image is up to date (context $hash)"
    buildah tag "$image" "$IMAGE_REGISTRY/rlkube-$name:$COMMIT"
    [ -z "$push_to" ] || { push "$image" "$name" "$TAG" && push "$image" "$name" "$COMMIT"; }
    continue
  else
    for base in $(sed -n 's/^FROM[[:space:]]\+\([^[:space:]]*\).*/\1/p' "$dockerfile"); do
      case $base in python:*) ensure_base "$base" ;; esac
    done
  fi
  start=$(date +%s)
  if [ "$ENGINE" = buildah ]; then
    run "${NICE[@]}" buildah bud --layers --pull=never --runtime runc --network host \
      --ulimit nofile=20000:20000 --ulimit nproc=4096:4096 \
      --label "org.rlkube.context=$hash" "${secret[@]}" "${volumes[@]}" -f "$dockerfile" "${tags[@]}" .
    [ -n "$dry_run" ] || size=$(buildah images --format '{{.Size}}' "$image")
  else
    DOCKER_BUILDKIT=1 run docker build "${secret[@]}" -f "$dockerfile" "${tags[@]}" .
    [ -n "$dry_run" ] || size=$(docker image ls --format '{{.Size}}' "$image")
  fi
  [ -n "$dry_run" ] || echo "images: $image built in $(( $(date +%s) - start )) s, $size"
  [ -z "$push_to" ] || { push "$image" "$name" "$TAG" && push "$image" "$name" "$COMMIT"; }
done
