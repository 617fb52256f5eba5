//go:build tools

// Package helm only records the main package built from this module (the helm CLI the chart
// tests run). See tools/build-helm.sh.
package helm

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
