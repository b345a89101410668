// Command etcd is etcd's own server entry point, built from the Go module proxy so that tests
// run a real etcd of a pinned version. It is the same as etcd's server/main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
