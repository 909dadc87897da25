# The reconfigure container of the slurmctld pod (the slurm chart). Every few seconds it
# stages the `config` volume (kept current by the kubelet) as the init container did; when
# the files differ from those it last applied, it checks slurm.conf with Slurm's own parser,
# puts the files into /etc/slurm and runs `scontrol reconfigure`. Slurm's refusal is logged
# here and the last good files stay in /etc/slurm, so slurmctld keeps (or restarts with)
# its last good configuration. A refused set of files is not tried again until it changes.
# Each outcome is also recorded as an Event on this pod (reason Reconfigured, or
# ConfigRefused with Slurm's message), by post-event.py unless RECONFIGURE_EVENT names
# another command (TYPE REASON MESSAGE).
# The paths are the pod's unless SLURM_ETC, CONFIG_SRC (stage's) or RECONFIGURE_WORK say.
log() { echo "slurm-reconfigure: $*"; }
trap 'exit 0' TERM INT
etc=${SLURM_ETC:-/etc/slurm}
work=${RECONFIGURE_WORK:-/run/slurm-reconfigure}
applied=$work/applied
new=$work/new
mkdir -p "$applied"
# What the init container put into /etc/slurm is what slurmctld started with.
for f in "$etc"/*; do
  n=${f##*/}
  case "$n" in slurm.key | jwt_hs256.key) continue ;; esac
  cp -p "$f" "$applied/$n"
done
refused=""
waiting=""
# Puts the files of $1 into /etc/slurm and removes those it lacks (of the ones we put there).
install_from() {
  for f in "$applied"/* "$new"/*; do
    n=${f##*/}
    [ -e "$1/$n" ] || rm -f "$etc/$n"
  done
  for f in "$1"/*; do
    n=${f##*/}
    cp -p "$f" "$etc/.$n.new" && mv -f "$etc/.$n.new" "$etc/$n"
  done
}
up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
# In the background: a slow or absent API server never holds up the next change.
record() { ${RECONFIGURE_EVENT:-python3 /opt/slurm-reconfigure/post-event.py} "$@" & }
while :; do
  sleep "${RECONFIGURE_PERIOD:-5}" &
  wait $!
  rm -rf "$new" && mkdir -p "$new" && stage "$new" || {
    log "cannot read the mounted configuration (/mnt/config); next try in a moment"
    continue
  }
  diff -r "$applied" "$new" >/dev/null 2>&1 && continue
  sum=$(cd "$new" && for f in *; do echo "$f" && cat -- "$f"; done | sha256sum)
  [ "$sum" = "$refused" ] && continue
  # slurmctld starting or restarting: a later round applies it (said once per change).
  if ! out=$(scontrol ping 2>&1) || ! echo "$out" | grep -q 'is UP'; then
    [ "$sum" = "$waiting" ] || log "a change waits for slurmctld to answer: $(echo "$out" | tr '\n' ' ')"
    waiting=$sum
    continue
  fi
  changed=""
  for f in "$applied"/* "$new"/*; do
    n=${f##*/}
    if [ ! -e "$new/$n" ]; then
      changed="$changed -$n"
    elif [ ! -e "$applied/$n" ]; then
      case "$changed " in *" +$n "*) ;; *) changed="$changed +$n" ;; esac
    elif [ "$f" = "$applied/$n" ] && ! cmp -s "$f" "$new/$n"; then
      changed="$changed $n"
    fi
  done
  log "configuration changed (+added -removed):$changed"
  what="changed (+added -removed):$changed:"
  if ! out=$(SLURM_CONF="$new/slurm.conf" scontrol show hostnames localhost 2>&1 >/dev/null); then
    out=$(echo "$out" | tr '\n' ' ') && out=${out% }
    log "refused by Slurm, not applied (slurmctld keeps its configuration): $out"
    record Warning ConfigRefused "$what refused by Slurm's parser, not applied; slurmctld keeps its configuration: $out"
    refused=$sum
    continue
  fi
  install_from "$new"
  if ! out=$(scontrol reconfigure 2>&1); then
    install_from "$applied"
    out=$(echo "$out" | tr '\n' ' ') && out=${out% }
    log "scontrol reconfigure refused it (slurmctld keeps its configuration; its log has Slurm's reason): $out"
    record Warning ConfigRefused "$what scontrol reconfigure refused it, not applied; slurmctld keeps its configuration (its log has Slurm's reason): $out"
    refused=$sum
    continue
  fi
  # slurmctld re-executes itself with the new files; one that cannot read them exits (in
  # the foreground, -D, it does not fall back) and its container restarts: from the last
  # good files, put back here.
  ok=""
  for _ in $(seq 1 "${RECONFIGURE_DEADLINE:-30}"); do
    sleep 1 &
    wait $!
    if up; then ok=1; break; fi
  done
  if [ -z "$ok" ]; then
    install_from "$applied"
    log "slurmctld did not answer within ${RECONFIGURE_DEADLINE:-30} s of reconfiguring: the last good files are back in /etc/slurm and it starts from them; Slurm's message: kubectl logs <this pod> -c slurmctld --previous"
    record Warning ConfigRefused "$what slurmctld did not answer within ${RECONFIGURE_DEADLINE:-30} s of reconfiguring: the last good files are back and it starts from them; Slurm's message: kubectl logs ${POD_NAME:-<this pod>} -c slurmctld --previous"
    refused=$sum
    continue
  fi
  rm -rf "$applied" && mv "$new" "$applied"
  log "applied: slurmctld re-read its configuration and told the slurmd and sackd daemons to fetch it${out:+ ($out)}"
  record Normal Reconfigured "$what applied: slurmctld re-read its configuration and told the slurmd and sackd daemons to fetch it"
done
