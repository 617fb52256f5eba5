"""The local-cluster harness: etcd, kube-apiserver, kube-scheduler, KubeVirt's virt-api and
virt-controller and KWOK built from pinned Go modules and run on loopback, a fleet of fake GPU
nodes, `gpu-binder cluster up` and `gpu-binder demo`. Used by the e2e tests, the demo and the
e2e benchmark; never imported by production code and not part of the image."""
