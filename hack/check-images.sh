#!/usr/bin/env bash
# Smoke-check the images `make images` built, in a throwaway containerd (own root, state and
# socket under a temp dir; stopped and removed at the end): import both archives, then in
# containers sharing one network namespace (loopback only) run slurmctld, slurmd configless
# (only the key mounted) and slurmrestd as user restd, submit a job and wait for COMPLETED,
# and run the Slinky image's entry points as uid 65532.
# Needs containerd, ctr, containerd-shim-runc-v2 and runc in ~/.cache/slinky/bin (the test
# bed's node build puts them there).
set -euo pipefail

CACHE="${SLINKY_CACHE:-$HOME/.cache/slinky}"
BIN="$CACHE/bin"
IMAGES="$CACHE/images/images.json"
for b in containerd ctr containerd-shim-runc-v2 runc; do
  [ -x "$BIN/$b" ] || { echo "check-images: $BIN/$b missing" >&2; exit 1; }
done
[ -f "$IMAGES" ] || { echo "check-images: $IMAGES missing: run make images" >&2; exit 1; }
ref() { python3 -c "import json,sys; print({i['name']: i['ref'] for i in json.load(open(sys.argv[1]))['images']}[sys.argv[2]])" "$IMAGES" "$1"; }
archive() { python3 -c "import json,sys; print({i['name']: i['archive'] for i in json.load(open(sys.argv[1]))['images']}[sys.argv[2]])" "$IMAGES" "$1"; }
SLURM=$(ref slurm)
SLINKY=$(ref slinky)

dir=$(mktemp -d /tmp/check-images.XXXXXX)
sock="$dir/containerd.sock"
ctr() { "$BIN/ctr" --address "$sock" -n k8s.io "$@"; }
cid() { echo "check-images-$(basename "$dir" | tr -cd 'a-zA-Z0-9' | tr 'A-Z' 'a-z')-$1"; }
ctd_pid=""
netns_name="$(cid net)"
cleanup() {
  set +e
  if [ -n "$ctd_pid" ]; then
    for c in rest d ctl; do
      ctr task kill -s KILL "$(cid $c)" >/dev/null 2>&1
    done
    for c in rest d ctl; do
      for _ in $(seq 50); do ctr task delete "$(cid $c)" >/dev/null 2>&1 && break; ctr task ls -q | grep -qx "$(cid $c)" || break; sleep 0.1; done
      ctr container delete "$(cid $c)" >/dev/null 2>&1
    done
    kill "$ctd_pid"; wait "$ctd_pid" 2>/dev/null
  fi
  ip netns del "$netns_name" 2>/dev/null
  grep -q " $dir/" /proc/mounts && awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | xargs -r umount -l
  rm -rf --one-file-system "$dir"
}
on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "check-images: FAILED; logs:" >&2
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -20 "$f" >&2; }; done
  fi
  cleanup
}
trap on_exit EXIT

cat > "$dir/config.toml" <<CONF
version = 3
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
CONF
PATH="$BIN:$PATH" "$BIN/containerd" --config "$dir/config.toml" > "$dir/containerd.log" 2>&1 &
ctd_pid=$!
for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done

for name in slurm slinky; do
  start=$(date +%s%N)
  ctr images import "$(archive $name)" >/dev/null
  echo "import $name: $(( ($(date +%s%N) - start) / 1000000 )) ms"
done
ctr images ls | awk 'NR > 1 {print "imported: " $1 " " $3}'

# Slurm configuration for slurmctld and slurmrestd; slurmd gets only the key.
conf="$dir/etc-slurm"; key="$dir/etc-key"
mkdir -p "$conf" "$key"
head -c 1024 /dev/urandom > "$conf/slurm.key"
head -c 32 /dev/urandom > "$conf/jwt.key"
cp "$conf/slurm.key" "$key/slurm.key"
cat > "$conf/slurm.conf" <<CONF
ClusterName=imagecheck
SlurmctldHost=ctl(127.0.0.1)
SlurmctldParameters=enable_configless
SlurmUser=slurm
AuthType=auth/slurm
CredType=cred/slurm
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt.key
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
ReturnToService=2
MaxNodeCount=4
SchedulerParameters=batch_sched_delay=0
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile=/run/slurmctld/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
echo "CgroupPlugin=disabled" > "$conf/cgroup.conf"
chown 64030:64030 "$conf"/*.key "$key/slurm.key"
chmod 600 "$conf"/*.key "$key/slurm.key"

# run NAME [ctr run options] IMAGE ARGS...: a detached container whose output goes to NAME.log.
# The containers share a network namespace of our own with loopback and a veth pair inside it:
# with loopback alone glibc's getaddrinfo(AI_ADDRCONFIG) finds no address and slurmctld
# cannot listen (a pod always has its eth0).
ip netns add "$netns_name"
ip -n "$netns_name" link set lo up
ip -n "$netns_name" link add v0 type veth peer name v1
ip -n "$netns_name" addr add 10.254.77.1/24 dev v0
ip -n "$netns_name" link set v1 up
ip -n "$netns_name" link set v0 up
netns="network:/run/netns/$netns_name"
run() {
  local c=$1; shift
  ctr run -d --runc-binary "$BIN/runc" --log-uri "file://$dir/$c.log" "$@" >/dev/null
}
run ctl --with-ns "$netns" --mount "type=bind,src=$conf,dst=/etc/slurm,options=rbind:ro" \
  --hostname ctl \
  "$SLURM" "$(cid ctl)" /usr/bin/tini -- /usr/local/bin/slurm-entrypoint slurmctld -D -i
ex() { local c=$1; shift; ctr task exec --exec-id "x$RANDOM" "$(cid "$c")" "$@"; }
for _ in $(seq 100); do ex ctl scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
ex ctl scontrol ping

run d --with-ns "$netns" --mount "type=bind,src=$key,dst=/etc/slurm,options=rbind:ro" \
  --hostname n1 "$SLURM" "$(cid d)" /usr/bin/tini -- /usr/local/bin/slurm-entrypoint \
  slurmd -D -Z -N n1 --conf-server 127.0.0.1:6817 --conf "CPUs=1 RealMemory=500"
for _ in $(seq 150); do ex ctl sinfo -h -N -o '%N %t' | grep -q '^n1 idle' && break; sleep 0.2; done
ex ctl sinfo -N -o '%N %t %c %m'
ex d ls /var/spool/slurmd/conf-cache
ex d sh -c '! ls /etc/slurm/slurm.conf 2>/dev/null' && echo "slurmd: no slurm.conf mounted (configless)"

job=$(ex ctl sbatch --parsable -o /tmp/job.out --wrap 'echo hello from $(hostname); sleep 1')
for _ in $(seq 150); do
  state=$(ex ctl scontrol show job "$job" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break;; esac
  sleep 0.2
done
echo "job $job: $state; output: $(ex d cat /tmp/job.out)"
[ "$state" = COMPLETED ]
zombies=$(ex d ps -eo stat= | grep -c '^Z' || true)
echo "slurmd container zombies after the job: $zombies"

run rest --with-ns "$netns" --mount "type=bind,src=$conf,dst=/etc/slurm,options=rbind:ro" \
  --env SLURM_JWT=daemon "$SLURM" "$(cid rest)" /usr/bin/tini -- \
  /usr/local/bin/slurm-entrypoint slurmrestd -u restd -g restd -a rest_auth/jwt 127.0.0.1:6820
token=$(ex ctl scontrol token username=root lifespan=60 | cut -d= -f2)
# bash's /dev/tcp (the image has no HTTP client); slurmrestd keeps the connection open.
ping="GET /slurm/v0.0.45/ping HTTP/1.1\r\nHost: x\r\nX-SLURM-USER-NAME: root\r\nX-SLURM-USER-TOKEN: $token\r\n\r\n"
reply=""
for _ in $(seq 50); do
  reply=$(ex ctl bash -c "exec 3<>/dev/tcp/127.0.0.1/6820 && printf '$ping' >&3 && timeout 2 cat <&3" 2>/dev/null || true)
  echo "$reply" | grep -q '"responding": true' && break
  sleep 0.2
done
echo "slurmrestd: $(echo "$reply" | head -1 | tr -d '\r'), slurmctld responding: $(echo "$reply" | grep -c '"responding": true')"
echo "slurmrestd runs as: $(ex rest ps -o user= -C slurmrestd)"
echo "$reply" | grep -q '"responding": true'

out=$(ctr run --rm --runc-binary "$BIN/runc" "$SLINKY" "$(cid op)" /usr/bin/tini -- \
  sh -c 'id -u; python --version; slurm-operator --help >/dev/null && echo slurm-operator ok; command -v slurm-bridge')
echo "$out" | sed 's/^/slinky image: /'
echo "$out" | head -1 | grep -qx 65532
echo "check-images: OK"
