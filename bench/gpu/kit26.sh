#!/usr/bin/env bash
# Build the vLLM-Omni 0.26 server kit for bench/gpu/issue25.sh here (a machine with a registry), as pieces a
# device call can carry, beside the 0.30 kit of bench/gpu/kit.sh (its .kit/pNN stay as they are):
#   WHEELS26=<folder> bash bench/gpu/kit26.sh
# WHEELS26 holds the 48 wheels of the GPU kit's requirements-kit.txt (vllm 0.26.0 + vllm-omni 0.26.0 on the
# image's torch 2.11, 386 MB), as its README's `pip download --no-deps --only-binary=:all: ... -r
# requirements-kit.txt` leaves them (hash-checked against the list). The tar holds wheels26/ and SHA256SUMS26;
# split into .kit/qNN of PIECE_BYTES (the size and why: bench/gpu/kit_piece.sh). On the device:
# `bash bench/gpu/device.sh issue25 receive26 NN` per piece, then `... issue25 setup26 N`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
WHEELS26="${WHEELS26:?folder of the 0.26 kit wheels (requirements-kit.txt)}"
. "$REPO/bench/gpu/kit_piece.sh"      # PIECE_BYTES, and why that size
n_wheels=$(ls "$WHEELS26"/*.whl | wc -l)
[ "$n_wheels" -eq 48 ] || { echo "kit26: $n_wheels wheels in $WHEELS26, the list has 48" >&2; exit 3; }
ls "$WHEELS26"/vllm-0.26.0-*.whl "$WHEELS26"/vllm_omni-0.26.0-*.whl > /dev/null
B="$REPO/.kit/build26"
rm -rf "$B"; mkdir -p "$B/wheels26"
ln -s "$WHEELS26"/*.whl "$B/wheels26/"
(cd "$B" && find -L wheels26 -type f -print0 | sort -z | xargs -0 sha256sum > SHA256SUMS26)
P="$REPO/.kit/q"
rm -f "$P"[0-9][0-9]
tar -C "$B" -chf - SHA256SUMS26 wheels26 | split -b "$PIECE_BYTES" -d -a 2 - "$P"
n=$(ls "$P"[0-9][0-9] | wc -l)
echo "kit26: $n_wheels server wheels (vllm 0.26.0 + vllm-omni 0.26.0); $n pieces of ${PIECE_BYTES} bytes"
echo "PIECES26=$n"
