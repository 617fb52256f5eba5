"""kube-controller-manager running only its DRA controllers, for the local cluster's DRA world
(docs/contract.md §3b, DR5 and HL1):

- `resourceclaim-controller` makes claims from ResourceClaimTemplates for Pods, clears
  `status.reservedFor` when a Pod is done, and removes kube-scheduler's delete protection from
  a deallocated claim, so deleting an allocated claim completes (without it the claim hangs on
  its finalizer);
- `device-taint-eviction-controller` (features DynamicResourceAllocation and DRADeviceTaints,
  both on in 1.36; DeviceTaintRules read through `resource.k8s.io/v1beta2` under
  `DRADeviceTaintRules`, which FEATURE_GATES turns on) deletes a scheduled Pod whose allocated
  claim reserves a device under a `NoExecute` taint it does not tolerate (a ResourceSlice's
  taint or a DeviceTaintRule's), after a `DisruptionTarget` condition
  `DeletionByDeviceTaintManager`: a running VM's launcher Pod on a GPU tainted NoExecute
  (HL1).

Built from the same pinned `k8s.io/kubernetes` module as kube-apiserver
(tools/build-controlplane.sh). It runs as the user `system:kube-controller-manager` (a client
certificate of the control plane's CA) with the rights Kubernetes bootstraps for those
controllers, the ClusterRoles `system:controller:resource-claim-controller` and
`system:controller:device-taint-eviction-controller`, and
`--use-service-account-credentials=false` (no token controller runs here): no more than the
real controllers may do. No other controller runs (no garbage collector, no namespace or quota
controller), so the other tests' world is unchanged beside it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import yaml

from localcluster.controlplane import FEATURE_GATES, ControlPlane, ControlPlaneError, spawn_logged, stop_process

USER = "system:kube-controller-manager"
CONTROLLERS = ("resourceclaim-controller", "device-taint-eviction-controller")
"""kube-controller-manager v1.36's names of the controllers run (cmd/kube-controller-manager/names)."""
CLUSTER_ROLES = {"gpu-binder-local:resourceclaim-controller": "system:controller:resource-claim-controller",
                 "gpu-binder-local:device-taint-eviction-controller":
                     "system:controller:device-taint-eviction-controller"}
"""ClusterRoleBinding name -> the bootstrap ClusterRole it gives USER (kube-apiserver's
bootstrap policy, plugin/pkg/auth/authorizer/rbac/bootstrappolicy/controller_policy.go)."""
CLUSTER_ROLE = CLUSTER_ROLES["gpu-binder-local:resourceclaim-controller"]
STARTED_LINE = "Starting resource claim controller"
SYNCED_LINE = "Caches are synced"
"""kube-controller-manager v1.36's log lines (klog, --v=2) saying the claim controller runs."""
TAINT_SYNCED_LINE = "Underlying informers have synced"
"""The device-taint eviction controller's line (klog V(1)) once its informers (Pods, claims,
slices, DeviceTaintRules, DeviceClasses) synced and its workers start."""


class ClaimController:
    """kube-controller-manager with `--controllers=resourceclaim-controller,device-taint-eviction-controller`
    against `cp`.

    `start()` binds the controllers' bootstrap ClusterRoles to their user, spawns the process
    (log `<dir>/kube-controller-manager.log`) and returns once the log says the claim
    controller started and its informers synced and the eviction controller's informers
    synced (within `start_timeout` seconds); `stop()` ends it. Raises ControlPlaneError when
    the binary is missing (`tools/build-controlplane.sh` builds it), a ClusterRole does not
    exist, or the process exits during start-up (with its log's tail). A context manager."""

    def __init__(self, cp: ControlPlane, directory: Path | None = None,
                 start_timeout: float = 30.0) -> None:
        self.cp = cp
        # absolute: the process runs in this folder (spawn_logged's cwd), so a relative path
        # in its arguments would be looked up under itself
        self.dir = Path(directory or cp.dir).resolve()
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self._log_from = 0

    @property
    def binary(self) -> Path:
        """The kube-controller-manager executable beside the control plane's kube-apiserver."""
        return Path(self.cp.binaries.kube_apiserver).with_name("kube-controller-manager")

    def __enter__(self) -> "ClaimController":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "ClaimController":
        """Start the controller (see the class docstring); idempotent while it runs."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        if not os.access(self.binary, os.X_OK):
            raise ControlPlaneError(f"kube-controller-manager missing or not executable: "
                                    f"{self.binary} (tools/build-controlplane.sh builds it)")
        bindings = []
        for binding, role in CLUSTER_ROLES.items():
            if self.cp.kubectl("get", "clusterrole", role, check=False).returncode != 0:
                raise ControlPlaneError(f"ClusterRole {role} is missing: this kube-apiserver "
                                        "does not bootstrap the DRA controller's role")
            bindings.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                             "metadata": {"name": binding},
                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                         "name": role},
                             "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                           "name": USER}]})
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(bindings))
        kubeconfig = self.cp.write_user_kubeconfig(self.dir / "kube-controller-manager.kubeconfig", USER)
        try:  # the log is appended to: a restart reads only what this process writes
            self._log_from = (self.dir / "kube-controller-manager.log").stat().st_size
        except OSError:
            self._log_from = 0
        self.proc = spawn_logged(self.dir, "kube-controller-manager", [
            str(self.binary), f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}", "--leader-elect=false",
            "--use-service-account-credentials=false", "--secure-port=0",
            f"--feature-gates={FEATURE_GATES}", "--v=2"])
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.proc = None
                raise ControlPlaneError(f"kube-controller-manager exited during start-up:\n{tail}")
            if self._synced():
                return self
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise ControlPlaneError(f"kube-controller-manager's claim and eviction controllers not synced within "
                                f"{self.start_timeout:.0f} s:\n{tail}")

    def _synced(self) -> bool:
        """Whether the log shows the claim controller started and, after that, its caches
        synced, and the device-taint eviction controller's informers synced (in what the
        running process wrote)."""
        try:
            with open(self.dir / "kube-controller-manager.log", "rb") as f:
                f.seek(self._log_from)
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        started = text.find(STARTED_LINE)
        return started >= 0 and text.find(SYNCED_LINE, started) >= 0 and TAINT_SYNCED_LINE in text

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        """The last `lines` lines of the controller's log ('(no log)' when there is none)."""
        try:
            text = (self.dir / "kube-controller-manager.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after a grace) and wait for it."""
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
