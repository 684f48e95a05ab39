package csiclient

import "strings"

// ReservedParameterPrefix starts the StorageClass parameter keys that are
// meant for the sidecar (secret references, fstype, the extra create
// metadata), never for the driver: CreateVolume is sent the parameters
// without them.
const ReservedParameterPrefix = "csi.storage.k8s.io/"

// DriverParameters returns a copy of a StorageClass's parameters without
// the keys under ReservedParameterPrefix: the parameters as the driver
// sees them in CreateVolume, for the other calls that take a class's
// parameters (GetCapacity). Nil for none.
func DriverParameters(params map[string]string) map[string]string {
	var out map[string]string
	for k, v := range params {
		if strings.HasPrefix(k, ReservedParameterPrefix) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(params))
		}
		out[k] = v
	}
	return out
}
