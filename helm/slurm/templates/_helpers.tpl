{{- /* Prefix of every name: the release name unless overridden. */ -}}
{{- define "slurm.prefix" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{- define "slurm.clusterName" -}}
{{- default (include "slurm.prefix" .) .Values.clusterName }}
{{- end }}

{{- define "slurm.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slinky
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- /* Selector labels of one component: (dict "root" $ "component" "controller") */ -}}
{{- define "slurm.selectorLabels" -}}
app.kubernetes.io/name: slurm{{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "slurm.image" -}}
{{- $img := .image | default dict }}
{{- printf "%s:%s" (default .root.Values.image.repository $img.repository) (default .root.Chart.AppVersion (default .root.Values.image.tag $img.tag)) }}
{{- end }}

{{- define "slurm.controllerName" -}}
{{- printf "%s-controller" (include "slurm.prefix" .) }}
{{- end }}

{{- /* Where slurmd pods and clients reach slurmctld: the headless Service's name. */ -}}
{{- define "slurm.controllerHost" -}}
{{- if .Values.external.enabled }}
{{- required "external.controllerHost is required in hybrid mode (external.enabled)" .Values.external.controllerHost }}
{{- else }}
{{- printf "%s.%s.svc.%s" (include "slurm.controllerName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}
{{- end }}

{{- define "slurm.controllerPort" -}}
{{- if .Values.external.enabled }}{{ .Values.external.controllerPort }}{{ else }}{{ .Values.controller.port }}{{ end }}
{{- end }}

{{- define "slurm.restapiUrl" -}}
{{- if .Values.external.enabled }}
{{- required "external.restapiUrl is required in hybrid mode (external.enabled)" .Values.external.restapiUrl }}
{{- else }}
{{- printf "http://%s-restapi.%s.svc.%s:%v" (include "slurm.prefix" .) .Release.Namespace .Values.clusterDomain .Values.restapi.port }}
{{- end }}
{{- end }}

{{- define "slurm.slurmKeySecret" -}}
{{- default (printf "%s-slurm-key" (include "slurm.prefix" .)) .Values.slurmKey.existingSecret }}
{{- end }}

{{- define "slurm.jwtKeySecret" -}}
{{- default (printf "%s-jwt-key" (include "slurm.prefix" .)) .Values.jwtKey.existingSecret }}
{{- end }}

{{- define "slurm.nodesetName" -}}
{{- printf "%s-compute-%s" (include "slurm.prefix" .root) .nodeset.name }}
{{- end }}

{{- /* key: value map -> "Key=value Key2=value2", keys sorted. */ -}}
{{- define "slurm.confOptions" -}}
{{- $out := list }}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%v" $k $v) }}{{ end }}
{{- join " " $out }}
{{- end }}

{{- /*
Init container: copies slurm.conf, cgroup.conf, the other files of the `config` volume (the
chart's ConfigMap and the site's files, see slurm.stageFunction) and the keys into /etc/slurm
(an emptyDir) with the owner and mode Slurm insists on (keys owned by SlurmUser, 0600,
scripts executable), which ConfigMap and Secret volumes cannot give.
*/ -}}
{{- define "slurm.configInit" -}}
- name: config
  image: {{ include "slurm.image" (dict "root" .) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - /bin/sh
    - -ec
    - |
      {{- include "slurm.stageFunction" . | nindent 6 }}
      stage /etc/slurm
      install -o {{ .Values.slurmConfig.slurmUser }} -g {{ .Values.slurmConfig.slurmUser }} -m 0600 /mnt/slurm-key/slurm.key /mnt/jwt-key/jwt_hs256.key /etc/slurm/
  volumeMounts:
    - {name: etc-slurm, mountPath: /etc/slurm}
    - {name: config, mountPath: /mnt/config}
    - {name: slurm-key, mountPath: /mnt/slurm-key}
    - {name: jwt-key, mountPath: /mnt/jwt-key}
{{- end }}

{{- /* The chart's ConfigMap and the files of the site's ConfigMaps (slurmConfig.*Refs, under
the names Slurm reads them by), in one directory: a change to any of them reaches the mounted
files in place (the reconfigure sidecar applies it). A ConfigMap named but missing keeps the
pod from starting, and its events name it. */ -}}
{{- define "slurm.configVolumes" -}}
- name: etc-slurm
  emptyDir: {}
- name: config
  projected:
    sources:
      - configMap:
          name: {{ include "slurm.prefix" . }}-config
      {{- range $f := include "slurm.siteFiles" . | fromJsonArray }}
      {{- if $f.configMap }}
      - configMap:
          name: {{ $f.configMap }}
          items: [{key: {{ $f.key | quote }}, path: {{ $f.file | quote }}}]
      {{- end }}
      {{- end }}
- name: slurm-key
  secret:
    secretName: {{ include "slurm.slurmKeySecret" . }}
- name: jwt-key
  secret:
    secretName: {{ include "slurm.jwtKeySecret" . }}
{{- end }}

{{- /* Scheduling and common pod fields of a component's values. */ -}}
{{- define "slurm.podScheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "slurm.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{- /* compute.nodesets, each entry merged over compute.nodesetDefaults, as JSON. */ -}}
{{- define "slurm.nodesets" -}}
{{- $out := list }}
{{- range $i, $n := .Values.compute.nodesets }}
{{- if not $n.name }}
{{- fail (printf "compute.nodesets[%d].name is missing. Helm's --set replaces a list entry whole: --set compute.nodesets[%d].replicas=3 drops the entry's name (and every other key). Give the whole entry (--set compute.nodesets[%d].name=debug,compute.nodesets[%d].replicas=3) or use a values file (-f)" $i $i $i $i) }}
{{- end }}
{{- $out = append $out (mustMergeOverwrite (deepCopy $.Values.compute.nodesetDefaults) $n) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{- /*
The slurmd container's securityContext (YAML; empty: none): the entry's, plus
- SYS_PTRACE: slurmstepd (root) reads each job process's /proc/<pid>/io when it samples
  usage, and the kernel lets it only with this capability for another user's process (in a
  pod's own user namespace too); without it the whole sample is dropped and sacct's MaxRSS
  stays empty (measured on the test bed: "Permission denied" reading a job's /proc/<pid>/io
  in the container). Not added when the entry drops it (capabilities.drop: a namespace of
  Pod Security level baseline refuses it; MaxRSS then stays empty);
- SYS_ADMIN when jobs are isolated by cgroups in the node's user namespace (slurmd makes
  their cgroups below its own; the image's entrypoint remounts its cgroup writable); in a
  pod with its own user namespace (hostUsers false) slurmd needs none in a cgroup the
  runtime delegated to it.
A privileged container has both already.
*/ -}}
{{- define "slurm.slurmdSecurityContext" -}}
{{- $sc := deepCopy (default dict .nodeset.securityContext) }}
{{- if not $sc.privileged }}
{{- $caps := deepCopy (default dict $sc.capabilities) }}
{{- $add := default list $caps.add }}
{{- $drop := default list $caps.drop }}
{{- $need := list }}
{{- if not (or (has "SYS_PTRACE" $drop) (has "CAP_SYS_PTRACE" $drop)) }}{{ $need = append $need "SYS_PTRACE" }}{{ end }}
{{- if and (eq .root.Values.slurmConfig.jobIsolation "cgroup") (ne (toString .nodeset.hostUsers) "false") }}{{ $need = append $need "SYS_ADMIN" }}{{ end }}
{{- range $cap := $need }}
{{- if not (or (has $cap $add) (has (print "CAP_" $cap) $add)) }}
{{- $add = append $add $cap }}
{{- end }}
{{- end }}
{{- if $add }}
{{- $_ := set $caps "add" $add }}
{{- $_ := set $sc "capabilities" $caps }}
{{- end }}
{{- end }}
{{- with $sc }}{{ toYaml . }}{{ end }}
{{- end }}

{{- /* Labels of a component's own object: the release's plus name and component. */ -}}
{{- define "slurm.componentLabels" -}}
app.kubernetes.io/name: slurm{{ .component }}
app.kubernetes.io/component: {{ .component }}
{{ include "slurm.labels" .root }}
{{- end }}

{{- /*
The key Secrets the keys hook makes when they are missing (keys.yaml), as JSON: [{secret,
key, make ("bytes", "alnum" or "file"), arg (size or path), guard}]. Those named by an
existingSecret (or passwordSecretRef) are the site's: not made. No key is ever rendered:
two renders are the same bytes, and no pod annotation depends on a key.
*/ -}}
{{- define "slurm.madeKeys" -}}
{{- $out := list }}
{{- if not .Values.slurmKey.existingSecret }}
{{- $out = append $out (dict "secret" (include "slurm.slurmKeySecret" .) "key" "slurm.key" "make" "bytes" "arg" "1024" "guard" true) }}
{{- end }}
{{- if not .Values.jwtKey.existingSecret }}
{{- $out = append $out (dict "secret" (include "slurm.jwtKeySecret" .) "key" "jwt_hs256.key" "make" "bytes" "arg" "32") }}
{{- end }}
{{- $a := .Values.accounting }}
{{- if and $a.enabled (not .Values.external.enabled) $a.mariadb.enabled (not $a.storage.passwordSecretRef.name) }}
{{- $out = append $out (dict "secret" (include "slurm.dbSecret" .) "key" $a.storage.passwordSecretRef.key "make" "alnum" "arg" "24") }}
{{- end }}
{{- if include "slurm.sshEnabled" . }}
{{- $out = append $out (dict "secret" (include "slurm.sshHostKeySecret" .) "key" "ssh_host_ecdsa_key" "make" "file" "arg" "/keys/ssh_host_ecdsa_key") }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{- /* A string for a POSIX shell, in single quotes. */ -}}
{{- define "slurm.shQuote" -}}
'{{ replace "'" "'\\''" (toString .) }}'
{{- end }}

{{- /* The database slurmdbd stores into: the one named, else the chart's MariaDB. */ -}}
{{- define "slurm.dbHost" -}}
{{- $a := .Values.accounting }}
{{- if $a.storage.host }}{{ $a.storage.host }}
{{- else if $a.mariadb.enabled }}{{ include "slurm.prefix" . }}-mariadb
{{- else }}{{ fail "accounting.storage.host is required with accounting.enabled (or set accounting.mariadb.enabled=true for a database the chart runs)" }}
{{- end }}
{{- end }}

{{- define "slurm.dbSecret" -}}
{{- $a := .Values.accounting }}
{{- if $a.storage.passwordSecretRef.name }}{{ $a.storage.passwordSecretRef.name }}
{{- else if $a.mariadb.enabled }}{{ include "slurm.prefix" . }}-mariadb
{{- else }}{{ fail "accounting.storage.passwordSecretRef.name is required with accounting.enabled (or set accounting.mariadb.enabled=true for a database the chart runs)" }}
{{- end }}
{{- end }}

{{- /* Users and groups (nss extrausers) and the home claim: volumes and mounts shared by
the controller, login, compute and hook pods. */ -}}
{{- define "slurm.hasUsers" -}}
{{- if or .Values.users .Values.groups }}true{{ end }}
{{- end }}

{{- define "slurm.userMounts" -}}
{{- if include "slurm.hasUsers" . }}
- {name: users, mountPath: /var/lib/extrausers, readOnly: true}
{{- end }}
{{- include "slurm.sssdMounts" . }}
{{- end }}

{{- define "slurm.userVolumes" -}}
{{- if include "slurm.hasUsers" . }}
- name: users
  configMap:
    name: {{ include "slurm.prefix" . }}-users
{{- end }}
{{- include "slurm.sssdVolumes" . }}
{{- end }}

{{- /* The users' homes (login and compute pods). */ -}}
{{- define "slurm.homeMounts" -}}
{{- if .Values.homes.existingClaim }}
- {name: homes, mountPath: /home}
{{- end }}
{{- end }}

{{- define "slurm.homeVolumes" -}}
{{- if .Values.homes.existingClaim }}
- name: homes
  persistentVolumeClaim:
    claimName: {{ .Values.homes.existingClaim }}
{{- end }}
{{- end }}

{{- /* sacctmgr `set` options: "k=v k2=v2", each shell-quoted. */ -}}
{{- define "slurm.sacctSet" -}}
{{- $out := list }}
{{- range $k, $v := . }}{{ $out = append $out (include "slurm.shQuote" (printf "%s=%v" $k $v)) }}{{ end }}
{{- join " " $out }}
{{- end }}

{{- /* The headless Service of every slurmd pod of the release: each pod's DNS name is
<pod>.<this Service>, whatever its NodeSet. */ -}}
{{- define "slurm.slurmdServiceName" -}}
{{- printf "%s-slurmd" (include "slurm.prefix" .) }}
{{- end }}

{{- /*
dnsConfig of pods that talk to slurmd pods by their Slurm node names (slurmd forwarding a
step to its peers, MPI, srun and ssh on a login pod): every NodeSet pod's name resolves in
the one Service all of them share, so the list is the same for every NodeSet and adding or
removing one changes no other pod's template.
*/ -}}
{{- define "slurm.nodesetDnsConfig" -}}
dnsConfig:
  searches:
    - {{ printf "%s.%s.svc.%s" (include "slurm.slurmdServiceName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{- /* sshd runs on login pods or NodeSet pods: "true", else empty. */ -}}
{{- define "slurm.sshEnabled" -}}
{{- if or (and .Values.login.enabled (not .Values.external.enabled)) .Values.compute.ssh.enabled }}true{{ end }}
{{- end }}

{{- /* sshd's host key: made once by the keys hook, the same on every login and NodeSet pod
and kept across upgrades, so users never see "host key changed" after a rollout. */ -}}
{{- define "slurm.sshHostKeySecret" -}}
{{- printf "%s-ssh-host-keys" (include "slurm.prefix" .) }}
{{- end }}

{{- /* sshd's mounts and volumes (login pods; NodeSet pods with compute.ssh.enabled). */ -}}
{{- define "slurm.sshMounts" -}}
- {name: ssh-config, mountPath: /etc/slinky-ssh, readOnly: true}
- {name: ssh-host-keys, mountPath: /mnt/ssh-host-keys, readOnly: true}
- {name: authorized-keys, mountPath: /etc/ssh/authorized-keys, readOnly: true}
{{- end }}

{{- define "slurm.sshVolumes" -}}
- name: ssh-config
  configMap:
    name: {{ include "slurm.prefix" . }}-ssh
- name: ssh-host-keys
  secret:
    secretName: {{ include "slurm.sshHostKeySecret" . }}
    defaultMode: 0600
- name: authorized-keys
  secret:
    secretName: {{ include "slurm.prefix" . }}-authorized-keys
    # Read by sshd's AuthorizedKeysCommandUser (nobody); public keys.
    defaultMode: 0444
    optional: true
{{- end }}

{{- define "slurm.sshChecksum" -}}
checksum/ssh: {{ include "slurm.sshdConfig" . | sha256sum | trunc 16 | quote }}
{{- end }}

{{- /* The sidecar reads sssd.conf and the bind password at start: a change restarts the
pods that run it (NodeSet pods take it at their next roll: not worth draining them for). */ -}}
{{- define "slurm.sssdChecksum" -}}
{{- if .Values.sssd.enabled }}
checksum/sssd: {{ toJson .Values.sssd | sha256sum | trunc 16 | quote }}
{{- end }}
{{- end }}

{{- /*
The SSSD sidecar (a native sidecar: an init container that keeps running), for pods that
resolve users from the directory; the pod's other containers reach it through its NSS socket
(/var/lib/sss/pipes, shared). It starts, and answers, before they do.
*/ -}}
{{- define "slurm.sssdSidecar" -}}
{{- $s := .Values.sssd }}
{{- if $s.enabled }}
- name: sssd
  image: {{ include "slurm.image" (dict "root" . "image" $s.image) }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  restartPolicy: Always
  {{- if $s.bindDn }}
  env:
    - name: BIND_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ $s.bindPasswordSecretRef.name }}
          key: {{ $s.bindPasswordSecretRef.key }}
  {{- end }}
  command:
    - /usr/bin/tini
    - --
    - /bin/sh
    - -ec
    - |
      umask 077
      # The shared socket directory starts empty (and mode 0777): root's alone, and sssd's
      # private one goes back in.
      chmod 0755 /var/lib/sss/pipes
      mkdir -p /var/lib/sss/pipes/private
      cp /mnt/sssd/sssd.conf /etc/sssd/sssd.conf
      if [ -n "${BIND_PASSWORD:-}" ]; then
        printf 'ldap_default_authtok = %s\n' "$BIND_PASSWORD" >> /etc/sssd/sssd.conf
      fi
      exec sssd -i --logger=stderr
  startupProbe:
    exec:
      command: ["test", "-S", "/var/lib/sss/pipes/nss"]
    periodSeconds: 1
    failureThreshold: 120
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: sssd-config, mountPath: /mnt/sssd, readOnly: true}
    - {name: sssd-pipes, mountPath: /var/lib/sss/pipes}
    {{- if or $s.caCert.configMap $s.caCert.secret }}
    - {name: sssd-ca, mountPath: /etc/sssd/ca, readOnly: true}
    {{- end }}
{{- end }}
{{- end }}

{{- /* The CA file SSSD checks the directory's certificate with (ldap_tls_cacert): the site's
CA (sssd.caCert, mounted by the sidecar) or the image's public CA bundle. */ -}}
{{- define "slurm.sssdCaCert" -}}
{{- $c := .Values.sssd.caCert }}
{{- if or $c.configMap $c.secret -}}
/etc/sssd/ca/ca.crt
{{- else -}}
/etc/ssl/certs/ca-certificates.crt
{{- end }}
{{- end }}

{{- define "slurm.sssdMounts" -}}
{{- if .Values.sssd.enabled }}
# Read-only: users here must not replace the socket root's lookups go to.
- {name: sssd-pipes, mountPath: /var/lib/sss/pipes, readOnly: true}
{{- end }}
{{- end }}

{{- define "slurm.sssdVolumes" -}}
{{- if .Values.sssd.enabled }}
- name: sssd-config
  configMap:
    name: {{ include "slurm.prefix" . }}-sssd
- name: sssd-pipes
  emptyDir: {}
{{- with .Values.sssd.caCert }}
{{- if .configMap }}
- name: sssd-ca
  configMap:
    name: {{ .configMap }}
    items: [{key: {{ .key | quote }}, path: ca.crt}]
{{- else if .secret }}
- name: sssd-ca
  secret:
    secretName: {{ .secret }}
    items: [{key: {{ .key | quote }}, path: ca.crt}]
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- /* sshd_config of login pods (and NodeSet pods with compute.ssh.enabled). */ -}}
{{- define "slurm.sshdConfig" -}}
# Rendered by the slurm chart (login.*); add lines with login.extraSshdConfig (sshd keeps
# the first value it reads: they cannot override a setting made here).
Port 22
HostKey /etc/ssh/host-keys/ssh_host_ecdsa_key
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
# Keys from the Secret {{ include "slurm.prefix" . }}-authorized-keys (users[].sshAuthorizedKeys,
# login.authorizedKeys), one file per user, and the user's own ~/.ssh/authorized_keys (in
# the shared home: how a user goes on from a login pod to a compute pod).
AuthorizedKeysFile .ssh/authorized_keys
AuthorizedKeysCommand /usr/bin/cat /etc/ssh/authorized-keys/%u
AuthorizedKeysCommandUser nobody
UsePAM yes
PrintMotd no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
AllowStreamLocalForwarding no
PermitTunnel no
Subsystem sftp /usr/lib/openssh/sftp-server
{{- with .Values.login.extraSshdConfig }}
{{ . }}
{{- end }}
{{- end }}

{{- /* Values of an earlier version of this chart (`helm upgrade --reuse-values` keeps them and
leaves out this version's new defaults): refused with what to do, not a nil-pointer error. */ -}}
{{- define "slurm.checkValues" -}}
{{- if or (not (hasKey .Values "upgradeCheck")) (not (hasKey .Values.sssd "minId")) (not (hasKey .Values.sssd "caCert")) }}
{{- fail "these values come from an earlier version of the slurm chart (helm upgrade --reuse-values?) and lack this version's settings (upgradeCheck, sssd.minId, sssd.caCert): upgrade with -f <your values file>, or with --reset-then-reuse-values, so that this version's defaults apply" }}
{{- end }}
{{- end }}

{{- /*
The files a site adds beside slurm.conf (slurmConfig.configFiles, *Scripts and their *Refs),
as JSON [{file, kind, configMap, key, content, from}]: kind "" for a config file, else
prolog, epilog, prologSlurmctld or epilogSlurmctld; configMap/key for a file from the
site's ConfigMap, content for one from values; from names the value it came from. A name
that is no plain file name, that the chart renders itself, or that two entries share is
refused naming the values.
*/ -}}
{{- define "slurm.siteFiles" -}}
{{- $c := .Values.slurmConfig }}
{{- $reserved := list "slurm.conf" "cgroup.conf" "slurm.key" "jwt_hs256.key" "healthcheck" "slurmdbd.conf" }}
{{- if $c.gresConf }}{{ $reserved = append $reserved "gres.conf" }}{{ end }}
{{- if $c.topology }}{{ $reserved = append $reserved "topology.yaml" }}{{ end }}
{{- $entries := list }}
{{- range $name, $content := $c.configFiles }}
{{- $entries = append $entries (dict "name" $name "kind" "" "content" (toString $content) "from" (printf "slurmConfig.configFiles[%q]" $name)) }}
{{- end }}
{{- range $i, $r := $c.configFileRefs }}
{{- $entries = append $entries (dict "name" $r.key "kind" "" "configMap" $r.configMap "key" $r.key "from" (printf "slurmConfig.configFileRefs[%d]" $i)) }}
{{- end }}
{{- range $kind := list "prolog" "epilog" "prologSlurmctld" "epilogSlurmctld" }}
{{- range $name, $content := index $c (printf "%sScripts" $kind) }}
{{- $entries = append $entries (dict "name" $name "kind" $kind "content" (toString $content) "from" (printf "slurmConfig.%sScripts[%q]" $kind $name)) }}
{{- end }}
{{- range $i, $r := index $c (printf "%sScriptRefs" $kind) }}
{{- $entries = append $entries (dict "name" $r.key "kind" $kind "configMap" $r.configMap "key" $r.key "from" (printf "slurmConfig.%sScriptRefs[%d]" $kind $i)) }}
{{- end }}
{{- end }}
{{- $prefix := dict "" "" "prolog" "prolog-" "epilog" "epilog-" "prologSlurmctld" "prolog-slurmctld-" "epilogSlurmctld" "epilog-slurmctld-" }}
{{- $seen := dict }}
{{- $out := list }}
{{- range $e := $entries }}
{{- if not (regexMatch "^[A-Za-z0-9][-_.A-Za-z0-9]*$" (toString $e.name)) }}
{{- fail (printf "%s: %q is not a file name (letters, digits, '-', '_' and '.', no '/'): it becomes a file beside slurm.conf" $e.from (toString $e.name)) }}
{{- end }}
{{- if and (eq $e.kind "") (has $e.name $reserved) }}
{{- fail (printf "%s: %s is a file the chart renders itself (set it through its own value, e.g. slurmConfig.extraSlurmConf for slurm.conf lines)" $e.from $e.name) }}
{{- end }}
{{- if and (eq $e.kind "") (regexMatch "^(prolog|epilog)-" $e.name) }}
{{- fail (printf "%s: %s: names starting with prolog- or epilog- are the scripts' (give scripts in slurmConfig.prologScripts and the like)" $e.from $e.name) }}
{{- end }}
{{- $file := printf "%s%s" (index $prefix $e.kind) $e.name }}
{{- if hasKey $seen $file }}
{{- fail (printf "%s and %s both make the file %s" (index $seen $file) $e.from $file) }}
{{- end }}
{{- $_ := set $seen $file $e.from }}
{{- $_ := set $e "file" $file }}
{{- $out = append $out $e }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{- /*
The settings of slurm.conf a running slurmctld cannot take by `scontrol reconfigure` (Slurm's
scontrol(1): not its listening ports nor its authentication; the state directory, the
cluster's name and its user at start only), the plugins that change how running jobs'
steps are tracked (the upgrade check guards ProctrackType and TaskPlugin), and where
accounting goes: their lines, whose hash restarts slurmctld, slurmrestd and the login pods
when one changes. Every other change is applied by the reconfigure sidecar.
*/ -}}
{{- define "slurm.restartSettings" -}}
{{- $conf := index (include (print $.Template.BasePath "/configmap.yaml") . | fromYaml) "data" "slurm.conf" }}
{{- regexFindAll "(?mi)^[ \\t]*(ClusterName|SlurmctldHost|SlurmctldPort|SlurmdPort|SlurmUser|SlurmdUser|AuthType|AuthAltTypes|AuthAltParameters|AuthInfo|CredType|TLSType|StateSaveLocation|ProctrackType|TaskPlugin|SelectType|SwitchType|AccountingStorageType|AccountingStorageHost|AccountingStoragePort|PluginDir)[ \\t]*=.*$" $conf -1 | join "\n" }}
{{- end }}

{{- define "slurm.restartChecksum" -}}
{{- include "slurm.restartSettings" . | sha256sum | trunc 16 | quote }}
{{- end }}

{{- /*
Shell function `stage DIR`: the chart's and the site's config files (the `config` volume at
/mnt/config) into DIR, scripts executable. Shared by the init container and the reconfigure
sidecar, so both make the same files.
*/ -}}
{{- define "slurm.stageFunction" -}}
stage() {
  for f in "${CONFIG_SRC:-/mnt/config}"/*; do
    n=${f##*/}
    case "$n" in
      healthcheck) continue ;;
      prolog-* | epilog-*) m=0755 ;;
      *) m=0644 ;;
    esac
    install -m "$m" "$f" "$1/$n" || return 1
  done
}
{{- end }}

{{- /* /dev/shm of a pod: memory-backed, at most sizeLimit (empty: the runtime's 64 MiB). */ -}}
{{- define "slurm.shmMounts" -}}
{{- if . }}
- {name: dev-shm, mountPath: /dev/shm}
{{- end }}
{{- end }}

{{- define "slurm.shmVolumes" -}}
{{- if . }}
- name: dev-shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ . }}
{{- end }}
{{- end }}
