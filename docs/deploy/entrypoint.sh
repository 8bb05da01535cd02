#!/usr/bin/env bash
# The container's entrypoint (docs/deploy/Dockerfile): `python -m vllm_omni_launcher serve` with the
# options the container is given (CMD, or compose `command:`), plus what a container needs:
#   * the API key from the secret file (VLLM_OMNI_API_KEY_FILE, default /run/secrets/vllm_omni_api_key),
#     else from VLLM_OMNI_API_KEY (an env file: written to a 0600 file, then removed from the
#     environment so that it never reaches the server), else refused unless VLLM_OMNI_NO_API_KEY=1;
#   * the API bound to 0.0.0.0:${VLLM_OMNI_PORT:-8091} inside the container (what `-p`/`ports:` maps;
#     the publish address decides who reaches it), unless --host / --port are given;
#   * a head (--accept-replicas PORT) registers replicas on the container's own address unless
#     VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST says otherwise (the launcher refuses a public one);
#   * a joined replica (--join ADDR:PORT) gets no key and no port: it has no HTTP server.
# Any other launcher command runs as given: `docker run IMAGE doctor`, `... setup`, `... plan ...`.
# exec: the launcher replaces this script, so tini's SIGTERM (docker stop) reaches it directly.
set -euo pipefail

launcher=(python -m vllm_omni_launcher)
case "${1:-}" in
  serve) shift ;;
  argv|generate|plan|doctor|setup|--version|--help|-h) exec "${launcher[@]}" "$@" ;;
esac

args=("$@")
has() {                       # has FLAG: FLAG (or FLAG=...) is among the options
  local a
  for a in "${args[@]}"; do
    case "$a" in "$1"|"$1"=*) return 0 ;; esac
  done
  return 1
}
refuse() { echo "vllm-omni-entrypoint: $*" >&2; exit 64; }

if has --join; then
  if has --api-key-from || has --api-key-file || has --no-api-key; then
    refuse "--join takes no API key option: a joined replica has no HTTP port (give the key to the head)"
  fi
  exec "${launcher[@]}" serve "${args[@]}"
fi

if ! has --host; then args+=(--host 0.0.0.0); fi
if ! has --port; then args+=(--port "${VLLM_OMNI_PORT:-8091}"); fi

if has --accept-replicas && [ -z "${VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST:-}" ]; then
  own="$(hostname -i 2>/dev/null | awk '{print $1}')"
  [ -n "$own" ] || refuse "cannot tell this container's address for --accept-replicas: set" \
    "VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST to the address the replicas reach"
  export VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST="$own"
fi

key_file="${VLLM_OMNI_API_KEY_FILE:-/run/secrets/vllm_omni_api_key}"
if has --api-key-from || has --api-key-file || has --no-api-key; then
  :                                                   # the options say it
elif [ -n "${VLLM_OMNI_API_KEY:-}" ]; then
  dir="$(mktemp -d)"                                  # the container's own /tmp: 0700
  (umask 077; printf '%s\n' "$VLLM_OMNI_API_KEY" > "$dir/api-key")
  unset VLLM_OMNI_API_KEY                             # a VLLM_* variable would reach the server
  args+=(--api-key-from "$dir/api-key")
elif [ -e "$key_file" ]; then
  args+=(--api-key-from "$key_file")
elif [ "${VLLM_OMNI_NO_API_KEY:-}" = 1 ]; then
  args+=(--no-api-key)
else
  refuse "no API key: mount one as the secret $key_file (compose: secrets: [vllm_omni_api_key]; one line, mode" \
    "0600, owned by uid $(id -u)), or set VLLM_OMNI_API_KEY from an env file, or VLLM_OMNI_NO_API_KEY=1 on a" \
    "trusted network only"
fi
exec "${launcher[@]}" serve "${args[@]}"
