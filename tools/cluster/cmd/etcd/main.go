// etcd for the test cluster: the server of the go.etcd.io/etcd release that k8s.io/kubernetes
// itself requires (go.mod), so the API server talks to the etcd it is tested against.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
