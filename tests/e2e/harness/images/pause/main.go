// pause is the Pod sandbox's process (what registry.k8s.io/pause is in a real
// cluster): it holds the Pod's namespaces open and exits when told to.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
