# Records one outcome of the reconfigure container as a Kubernetes Event on the slurmctld
# pod, so that `kubectl describe pod` and `kubectl get events` show it beside the pod's own
# events:  post-event.py TYPE REASON MESSAGE   (TYPE: Normal or Warning)
# Runs in the slurm image (python3, standard library only). The pod is named by POD_NAME,
# POD_NAMESPACE and POD_UID (the downward API); the token, the CA and the namespace are
# read from the container's projected volume (KUBE_SA_DIR); the API server is the one the
# kubelet names (KUBERNETES_SERVICE_HOST/PORT) unless KUBE_API_URL says (unit tests).
# The Event is a record only: when it cannot be posted (no token, API down, refused) that
# is said in one line and the exit status is still 0, so the caller never waits or fails.
import contextlib
import datetime
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

COMPONENT = "slurm-reconfigure"
MAX_MESSAGE = 1000
TIMEOUT = 5


def event(kind: str, reason: str, message: str, ns: str) -> dict[str, object]:
    pod = os.environ.get("POD_NAME", "")
    now = datetime.datetime.now(datetime.UTC)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{time.time_ns():x}", "namespace": ns},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod,
            "namespace": ns,
            "uid": os.environ.get("POD_UID", ""),
        },
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT},
        "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
        # An Event with eventTime must also name who reported it and the action.
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "reportingComponent": COMPONENT,
        "reportingInstance": pod,
        "action": "Reconfigure",
    }


def post(kind: str, reason: str, message: str) -> None:
    sa = os.environ.get("KUBE_SA_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
    ns = os.environ.get("POD_NAMESPACE", "")
    if not ns and os.path.exists(f"{sa}/namespace"):
        with open(f"{sa}/namespace") as f:
            ns = f.read().strip()
    base = os.environ.get("KUBE_API_URL", "")
    if not base:
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        host = f"[{host}]" if ":" in host else host
        base = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
    with open(f"{sa}/token") as f:  # read each time: the kubelet renews it
        token = f.read().strip()
    context = None
    if base.startswith("https:"):
        context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
        # Python 3.13 and later refuse by default a CA without a keyUsage extension, which
        # Kubernetes clients take (the test bed's CA has none: "CA cert does not include key
        # usage extension"); the chain and the server's name are still checked.
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    request = urllib.request.Request(
        f"{base.rstrip('/')}/api/v1/namespaces/{ns}/events",
        data=json.dumps(event(kind, reason, message, ns)).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT, context=context):
        pass


def main() -> int:
    if len(sys.argv) != 4:
        print(f"{COMPONENT}: usage: post-event.py TYPE REASON MESSAGE", flush=True)
        return 0
    kind, reason, message = sys.argv[1:]
    try:
        post(kind, reason, message)
    except Exception as e:  # any failure is told, and ignored
        detail = str(e)
        if isinstance(e, urllib.error.HTTPError):  # the API server's own reason
            with contextlib.suppress(Exception):
                detail += ": " + str(json.loads(e.read()).get("message", ""))
        print(f"{COMPONENT}: could not record Event {reason} on the pod: {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
