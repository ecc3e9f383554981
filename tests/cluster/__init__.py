"""A real Kubernetes control plane for the test suite, without Docker.

etcd, kube-apiserver and kube-controller-manager built from the Go module proxy (binaries.py), run as
local processes (controlplane.py) together with either a test-only process kubelet (kubelet.py) that
runs pods as local processes, or a real node (node.py: kubelet, kube-scheduler, containerd and CNI
plugins, with images made without a registry in images.py). Entry points: `python -m tests.cluster
build|start [--node]|stop` and the pytest fixtures in fixtures.py. docs/testing.md explains the tiers.
"""
