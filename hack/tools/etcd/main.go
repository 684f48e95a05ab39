// Command etcd is the upstream etcd server, built from the Go module proxy at
// the version pinned in go.mod, for the local test control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
