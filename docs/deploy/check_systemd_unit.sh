#!/usr/bin/env bash
# Runs the unit that `serve --print-systemd-unit` prints under a real systemd (PID 1 of its own PID,
# mount, cgroup and network namespaces, booted on a throw-away overlay of this machine's root), with
# the stub server (real vLLM-Omni, fake GPU: tests/contract/stub_vllm_serve.py) as the server program,
# and shows:
#   1. `systemd-analyze verify` of the printed unit, inside that systemd;
#   2. `systemctl start` returns when `serve` sent READY=1 (Type=notify), the API answers with the key
#      from the credential;
#   3. `systemctl stop`: SIGTERM to the launcher (KillMode=mixed), which stops its server group; the
#      unit's cgroup is empty before systemd's final SIGKILL would have anything to do;
#   4. kill -9 of the launcher: systemd SIGKILLs the rest of the cgroup, Restart=on-failure starts it
#      again, and the second stop also leaves nothing.
# Needs root (unshare, mount, overlayfs). Nothing is written outside the overlay: the booted system's
# /tmp, /run and /dev are its own, and units that touch the kernel or devices (udev, sysctl, modules,
# timers, ...) are masked in the overlay. Usage (from the repo root, after tests/run.sh made both venvs):
#   sudo bash docs/deploy/check_systemd_unit.sh 2>&1 | tee docs/deploy/results/systemd-check.txt
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
model="Wan-AI/Wan2.2-TI2V-5B-Diffusers"
unit="vllm-omni-launcher.service"
say() { printf '\n== %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "needs root (unshare --pid --mount --cgroup --net, overlayfs)"; exit 2; }
for tool in unshare nsenter /usr/lib/systemd/systemd; do
  command -v "$tool" >/dev/null || { echo "missing: $tool"; exit 2; }
done
if [ ! -x "$repo/.venv/bin/python" ] || [ ! -x "$repo/.venv-server/bin/python" ]; then
  echo "missing $repo/.venv or $repo/.venv-server (run tests/run.sh once)"; exit 2
fi
cgroot="$(findmnt -t cgroup2 -n -o TARGET | head -1)"
[ -n "$cgroot" ] || { echo "no cgroup2 hierarchy mounted"; exit 2; }

sentinel="$(mktemp /tmp/vllm-sdcheck-sentinel.XXXXXX)"      # must survive: proves the host /tmp was left alone
cg="$cgroot/vllm-sdcheck-$$"
mkdir "$cg"

# ---- the booted system: PID 1 of new namespaces, its root an overlay whose writes go to a tmpfs ----
inner="$(mktemp /tmp/vllm-sdcheck-inner.XXXXXX)"
cat > "$inner" <<'INNER'
set -euo pipefail
mount --make-rprivate /
mount -t tmpfs -o mode=0755 sdcheck /mnt
mkdir -p /mnt/upper /mnt/work /mnt/root
mount -t overlay overlay -o lowerdir=/,upperdir=/mnt/upper,workdir=/mnt/work /mnt/root
R=/mnt/root
mount -t proc proc "$R/proc"
mount -t sysfs -o ro sysfs "$R/sys"
mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=0755 tmpfs "$R/dev"
for d in null zero full random urandom tty; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mkdir -p "$R/dev/shm" "$R/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
for d in run tmp var/tmp; do mount -t tmpfs -o mode=1777 tmpfs "$R/$d"; done
chmod 0755 "$R/root"                                  # the server python lives under /root/.pyenv here
# the launcher's files as they are now: edits made in the checkout while this runs do not reach it
tar -C "$1" --exclude=./.venv --exclude=./.venv-server --exclude=./.git -cf - . | tar -C "$R$1" -xf -
chroot "$R" useradd --create-home --user-group --shell /usr/sbin/nologin vllmsvc
keep="systemd-journald.service systemd-journal-flush.service systemd-tmpfiles-setup.service systemd-journald.socket"
keep="$keep systemd-journald-dev-log.socket dbus.socket"
for wants in "$R"/lib/systemd/system/*.target.wants "$R"/etc/systemd/system/*.target.wants; do
  for u in "$wants"/*; do
    name="$(basename "$u")"
    case " $keep " in *" $name "*) continue ;; esac
    ln -sf /dev/null "$R/etc/systemd/system/$name"
  done
done
printf '[Unit]\nDescription=what the check boots to\n' > "$R/etc/systemd/system/sdcheck.target"
ip link set lo up
cd "$R"
mkdir -p oldroot
pivot_root . oldroot
umount -l /oldroot
mount --make-rshared /          # systemd sets up each unit's credentials in a child namespace and moves them here
exec env container=vllm-sdcheck /usr/lib/systemd/systemd --unit=sdcheck.target --log-level=notice
INNER

(echo "$BASHPID" > "$cg/cgroup.procs"
 exec unshare --fork --pid --mount --cgroup --net --mount-proc bash "$inner" "$repo") >/dev/null 2>&1 &
outer=$!
cleanup() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -n "${pid1:-}" ]; then
    echo "FAILED (exit $rc); the unit's journal:"
    nsenter -t "$pid1" -m -p -n -C -- journalctl -u "$unit" -o cat --no-pager 2>&1 | tail -60 || true
  fi
  if [ -n "${pid1:-}" ]; then kill -KILL "$pid1" 2>/dev/null || true; fi
  wait "$outer" 2>/dev/null || true
  find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  rm -f "$inner"
}
trap cleanup EXIT
for _ in $(seq 100); do
  pid1="$(pgrep -P "$outer" 2>/dev/null | head -1 || true)"
  [ -n "$pid1" ] && [ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = systemd ] && break
  sleep 0.2
done
[ "$(cat "/proc/$pid1/comm" 2>/dev/null)" = systemd ] || { echo "systemd did not start"; exit 1; }
ct() { nsenter -t "$pid1" -m -p -n -C -- "$@"; }
for _ in $(seq 150); do
  state="$(ct systemctl is-system-running 2>/dev/null || true)"
  case "$state" in running|degraded) break ;; esac
  sleep 0.2
done
say "systemd $(ct systemctl --version | head -1 | cut -d' ' -f2) is PID 1 of its namespaces (state: $state)"

# ---- the service, the way the unit's header says to install it ----
home=/home/vllmsvc
ct install -d -o vllmsvc -g vllmsvc -m 0700 "$home/.config/vllm-omni-launcher" "$home/data"
ct runuser -u vllmsvc -- sh -c "cat > $home/.config/vllm-omni-launcher/vllm_omni_launcher.json" <<JSON
{"server_command": ["$repo/.venv-server/bin/python", "$repo/tests/contract/stub_vllm_serve.py"],
 "data_dir": "$home/data", "startup_timeout_s": 600, "extra_env": {"VLLM_OMNI_STUB_STEP_S": "0.05"}}
JSON
ct sh -c 'umask 077; mkdir -p /etc/vllm-omni-launcher; python3 -c "import secrets; print(secrets.token_urlsafe(32))" > /etc/vllm-omni-launcher/api-key'
ct runuser -u vllmsvc -- env -u VLLM_OMNI_LAUNCHER_CONFIG HOME="$home" VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB=80 \
  "$repo/.venv/bin/python" -m vllm_omni_launcher serve --model "$model" --gpus 0 --print-systemd-unit \
  | ct tee "/etc/systemd/system/$unit" >/dev/null
# what this box adds, as an operator would: the GPU size NVML cannot see here (a drop-in)
ct mkdir -p "/etc/systemd/system/$unit.d"
printf '[Service]\nEnvironment=VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB=80\n' | ct tee "/etc/systemd/system/$unit.d/gpu.conf" >/dev/null
say "the printed unit"
ct cat "/etc/systemd/system/$unit"
say "systemd-analyze verify (inside the booted systemd; any line is a finding)"
ct systemd-analyze verify "/etc/systemd/system/$unit" 2>&1 | grep -v '^$' || echo "(nothing: clean)"
ct systemctl daemon-reload

members() {   # the unit's cgroup members as "pid comm" ("-" when the cgroup is gone or empty)
  local procs="/sys/fs/cgroup/system.slice/$unit/cgroup.procs" out=""
  out="$(ct sh -c "[ -f $procs ] && for p in \$(cat $procs); do echo \"\$p \$(cat /proc/\$p/comm 2>/dev/null)\"; done" || true)"
  echo "${out:--}"
}
show() { ct systemctl show "$unit" -p ActiveState -p SubState -p Result -p MainPID -p NRestarts -p StatusText; }

say "systemctl start (returns when serve sent READY=1)"
t0=$(date +%s); ct systemctl start "$unit"; echo "start returned after $(( $(date +%s) - t0 )) s"
show
url="$(ct journalctl -u "$unit" -o cat | sed -n 's/^Serving .* at \(http:[^ ]*\).*/\1/p' | tail -1)"
key="$(ct cat /etc/vllm-omni-launcher/api-key)"
echo "GET $url/v1/models with the credential's key: $(ct curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$url/v1/models")"
echo "GET $url/v1/models without a key: $(ct curl -s -o /dev/null -w '%{http_code}' "$url/v1/models")"
echo "cgroup members while ready:"; members

say "systemctl stop (SIGTERM to the launcher only; the final SIGKILL goes to whatever is left)"
t0=$(date +%s); ct systemctl stop "$unit"; echo "stop took $(( $(date +%s) - t0 )) s"
show
echo "cgroup members after stop:"; members
echo "stub processes left in the booted system: $(ct pgrep -f stub_vllm_serve.py | tr '\n' ' ' || true)"

say "kill -9 of the launcher (main process): systemd kills the rest, then restarts the unit"
ct systemctl start "$unit"
main="$(ct systemctl show "$unit" -p MainPID --value)"
echo "members before the kill:"; members
ct kill -KILL "$main"
for _ in $(seq 600); do
  [ "$(ct systemctl show "$unit" -p NRestarts --value)" -ge 1 ] && \
    [ "$(ct systemctl show "$unit" -p ActiveState --value)" = active ] && break
  sleep 0.5
done
show
echo "members of the restarted unit:"; members
ct systemctl stop "$unit"
echo "after the second stop:"; members
echo "stub processes left in the booted system: $(ct pgrep -f stub_vllm_serve.py | tr '\n' ' ' || true)"

say "the unit's journal (the launcher's lines and systemd's own)"
ct journalctl -u "$unit" -o short-monotonic --no-pager | sed 's/^\[ *\([0-9.]*\)\] [^ ]* /[\1] /'
say "host /tmp untouched: $( [ -f "$sentinel" ] && echo yes || echo NO)"
rm -f "$sentinel"
