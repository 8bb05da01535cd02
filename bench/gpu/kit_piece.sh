# shellcheck shell=bash
# Sourced by the kit builders (bench/gpu/kit.sh, bench/gpu/kit26.sh, bench/make_kit.sh): the size of one kit piece.
# A device call carries 64 MiB (67,108,864 bytes) in all: the carried piece plus the tracked tree (7.2 MB on
# 2026-12-05). 57 MiB pieces (59,768,832 bytes) went over once the tree grew, and the refused call lost the machine;
# 52,000,000-byte pieces leave ~7.9 MB for the tree to grow. PIECE_BYTES in the environment wins.
PIECE_BYTES="${PIECE_BYTES:-52000000}"
