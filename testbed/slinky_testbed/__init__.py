"""The local test bed: a real Kubernetes control plane and a real Slurm on loopback.

Not part of the product. It exists so that tests and `make dev` talk to real servers:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, real nodes (kubelet,
containerd, kube-proxy, CoreDNS), kwok, and
Slurm 26.05 (slurmctld, slurmrestd) from a Debian sid root file system.
"""
