//go:build tools

// Package tools records the commands built from this module (tools/build-kubevirt.sh).
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
)
