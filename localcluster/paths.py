"""Where the harness finds the repository's files: build scripts, the deployable manifests,
its own testing manifests and the KubeVirt VMI fixtures (copied from upstream, see
`fixtures/kubevirt/SOURCE.md`; nothing is read from outside the checkout at run time)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
MANIFESTS = REPO_ROOT / "k8s" / "manifests"
TESTING_MANIFESTS = HERE / "manifests" / "testing"
KUBEVIRT_FIXTURES = HERE / "fixtures" / "kubevirt"
