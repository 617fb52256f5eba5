"""The webhook's cache on the in-memory store, for tests of `k8s.webhook.admission.VMIAdmission`
without an API server: W1 reads the store's view (its snapshot, devices, and whether it
follows the API server), no VMI, KubeVirt's launcher defaults, every resource permitted."""

from __future__ import annotations

from types import SimpleNamespace

from fakes.memory_store import MemoryStore
from model.admission import LauncherDefaults
from model.housekeeping import VMIs


class StoreCache:
    """What `VMIAdmission` reads of `k8s.cache.ClusterCache`, on `store`."""

    def __init__(self, store: MemoryStore) -> None:
        self.view = store
        self.devices = SimpleNamespace(add_listener=lambda fn: None)

    def vmi_state(self) -> VMIs:
        return VMIs()

    def launcher_defaults(self) -> LauncherDefaults:
        return LauncherDefaults()

    def permitted_resources(self):
        return None
