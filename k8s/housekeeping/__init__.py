"""Housekeeping on the real API server (leader only): the attachments whose VMI never
appeared or is gone (H1, H2), the sets kept for a stopped VirtualMachine (H4), the
ResourceClaims the binder made (DR5) and the claim of an admitted VMI made again when someone
deleted it (DR6), the settings ConfigMap (H3) and the GPUClasses' conditions.

Decisions come from the pure, level-based `model.housekeeping` over the cache's `vmi_state()`
(live VMIs with uid and admission, tombstones of deleted incarnations); one worker per job
carries them out with field manager `gpu-binder-housekeeping`, and a thin `Housekeeper`
composes them into rounds:

- `devices.DeviceWorker`: H1, H2 and H4 on GPUDevices (clear, delete a template, write
  `keptUntil`; record a VMI's uid only on an attachment without an admission id, written
  before admission ids: an admitted set gets no uid link, issue 40), each destructive step
  confirmed by a live read;
- `kept.KeptSets`: H4's VirtualMachines, Events (`GPUSetKept`, `GPUSetReleased`), the VM
  condition `GPUSetKept`, and the keeps released (their claims go at once);
- `claims.ClaimsWorker`: H1/H2 of the binder's claims and DR6 (`GPUClaimRestored`);
- `settings.SettingsWorker`: H3 (`PolicyParameterMissing`);
- `class_conditions.ClassConditions`: GPUClass `Ready` (DR1) and `KubeVirtPermitted`;
- `lost.LostDevices`: HL3's Events (`GPUDeviceLost`) on a lost device's GPUDevices and node.

A round's device and claim work is skipped while an informer it reads is unhealthy (its
cache may be behind). While `Housekeeper.run` runs, a round judges only what changed since
the last one (`changes.Changes`, the keys the informers told; `model.housekeeping_index`),
and every set at least every 60 s and on a leader's first round. `Housekeeper.statistics()` is what the metrics read.
"""

from k8s.housekeeping.common import FIELD_MANAGER
from k8s.housekeeping.keeper import Housekeeper, HousekeepingStats
from k8s.housekeeping.settings import desired_settings

__all__ = ["FIELD_MANAGER", "Housekeeper", "HousekeepingStats", "desired_settings"]
