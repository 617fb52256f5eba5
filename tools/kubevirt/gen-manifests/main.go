// Command gen-manifests prints, as one JSON v1 List (status and creationTimestamp dropped), the objects virt-operator
// would install that gpu-binder's KubeVirt harness (localcluster/kubevirt.py) needs: every KubeVirt CRD,
// the RBAC of virt-controller and virt-api (and the cluster roles), and virt-api's mutating and
// validating webhook configurations (service clientConfig; the harness rewrites them to URLs).
// They come from KubeVirt's own code (pkg/virt-operator/resource/generate), so the schema is real.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

const namespace = "kubevirt"

func main() {
	crds := []func() (*extv1.CustomResourceDefinition, error){
		components.NewKubeVirtCrd,
		components.NewVirtualMachineInstanceCrd, components.NewPresetCrd, components.NewReplicaSetCrd,
		components.NewVirtualMachineCrd, components.NewVirtualMachineInstanceMigrationCrd,
		components.NewVirtualMachineSnapshotCrd, components.NewVirtualMachineSnapshotContentCrd,
		components.NewVirtualMachineRestoreCrd, components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd, components.NewVirtualMachinePoolCrd,
		components.NewMigrationPolicyCrd, components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd, components.NewVirtualMachineExportCrd,
		components.NewVirtualMachineCloneCrd, components.NewVirtualMachineBackupCrd,
		components.NewVirtualMachineBackupTrackerCrd,
	}
	var objs []interface{}
	for _, f := range crds {
		crd, err := f()
		if err != nil {
			fail(err)
		}
		objs = append(objs, crd)
	}
	var rbacs []runtime.Object
	rbacs = append(rbacs, rbac.GetAllCluster()...)
	rbacs = append(rbacs, rbac.GetAllApiServer(namespace)...)
	rbacs = append(rbacs, rbac.GetAllController(namespace, true)...)
	for _, o := range rbacs {
		objs = append(objs, o)
	}
	objs = append(objs,
		components.NewVirtAPIMutatingWebhookConfiguration(namespace),
		components.NewVirtAPIValidatingWebhookConfiguration(namespace),
	)
	items := make([]map[string]interface{}, 0, len(objs))
	for _, o := range objs {
		raw, err := json.Marshal(o)
		if err != nil {
			fail(err)
		}
		var m map[string]interface{}
		if err := json.Unmarshal(raw, &m); err != nil {
			fail(err)
		}
		delete(m, "status")
		if meta, ok := m["metadata"].(map[string]interface{}); ok {
			delete(meta, "creationTimestamp")
		}
		switch o.(type) { // the webhook constructors leave TypeMeta empty
		case *admissionregistrationv1.MutatingWebhookConfiguration:
			m["apiVersion"], m["kind"] = "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"
		case *admissionregistrationv1.ValidatingWebhookConfiguration:
			m["apiVersion"], m["kind"] = "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"
		}
		items = append(items, m)
	}
	out, err := json.MarshalIndent(map[string]interface{}{"apiVersion": "v1", "kind": "List", "items": items}, "", " ")
	if err != nil {
		fail(err)
	}
	os.Stdout.Write(append(out, '\n'))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gen-manifests:", err)
	os.Exit(1)
}
