// Command etcd runs the etcd server for the local test control plane.
//
// etcd's server module carries relative replace directives, so `go install` of
// it fails; depending on it from a module of our own builds the same binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
