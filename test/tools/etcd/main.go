// Command etcd is upstream etcd's server, built from a pinned module so the test control plane needs no download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
