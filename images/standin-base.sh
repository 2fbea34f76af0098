#!/usr/bin/env bash
# A stand-in for the images' base, python:3.11.7-slim-bookworm, on a machine that reaches Debian's
# archive and the package indexes but no container registry. Debian bookworm's own Python (3.11.2,
# not 3.11.7) and pip, made with debootstrap, imported into the local image store under the base's
# name, so `FROM python:3.11.7-slim-bookworm` builds unchanged. It is labelled
# org.rlkube.standin=debootstrap: `podman image inspect` tells it from the real base; and with this
# script's hash (org.rlkube.standin.script), by which images/build.sh makes it again when it changed.
#   sudo images/standin-base.sh [NAME]   (root: debootstrap and podman's store)
set -euo pipefail
NAME=${1:-docker.io/library/python:3.11.7-slim-bookworm}
# The machine's Debian mirror (deb822 sources first, then a one-line sources.list), else Debian's.
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)}
MIRROR=${MIRROR:-$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
# python3.11-dev: the official image carries Python's headers, and torch's inductor includes
# Python.h in the CPU kernels it compiles at run time (vLLM compiles some even with enforce_eager).
debootstrap --variant=minbase --include=python3.11,python3.11-dev,python3-pip,python3-venv,ca-certificates \
  bookworm "$root" "$MIRROR" >"$work/debootstrap.log" || { tail -20 "$work/debootstrap.log"; exit 1; }
# What the official image has: `python` and `pip` on PATH, pip allowed to install system-wide.
rm -f "$root/usr/lib/python3.11/EXTERNALLY-MANAGED"
ln -sf python3 "$root/usr/bin/python"
ln -sf pip3 "$root/usr/bin/pip"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*
tar -C "$root" --numeric-owner -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'LABEL org.rlkube.standin=debootstrap' \
  --change "LABEL org.rlkube.standin.script=$(sha256sum "$0" | cut -c1-16)" \
  --change 'CMD ["python3"]' - "$NAME" >/dev/null
echo "$NAME: stand-in from Debian bookworm ($MIRROR): $(chroot "$root" python3 --version)"
