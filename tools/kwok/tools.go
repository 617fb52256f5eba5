//go:build tools

// Package tools records the command built from this module (tools/build-kubevirt.sh).
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
