// hello is the e2e suite's test workload: it prints one line, then sleeps until
// it is stopped. With ONCE set it exits after the line (an initContainer).
// With LISTEN set (":8080") it also answers every HTTP request with that
// line, so a test can reach the Pod by its own address. With STARTED_AT set
// it first prints "started_at_unix_ns=N", the clock when its process began:
// the Pod-start benchmark reads it, as the status's timestamps have whole seconds.
//
// Statically linked (CGO off) so the image needs nothing but this binary.
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if os.Getenv("STARTED_AT") != "" {
		fmt.Printf("started_at_unix_ns=%d\n", time.Now().UnixNano())
	}
	line := os.Getenv("GREETING")
	if line == "" {
		line = "hello from the e2e image"
	}
	fmt.Println(line)
	if os.Getenv("ONCE") != "" {
		return
	}
	if addr := os.Getenv("LISTEN"); addr != "" {
		go func() {
			err := http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintln(w, line)
			}))
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}()
	}
	// PID 1 in its container gets no default signal handling: exit on TERM/INT
	// ourselves, or every Pod deletion would wait out its grace period.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
