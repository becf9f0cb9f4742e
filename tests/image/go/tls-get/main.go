// tls-get verifies TLS the way a Go credential-provider plugin does (ecr-credential-provider
// and its kin): with Go's system roots, which on Linux are SSL_CERT_FILE if set, else
// /etc/ssl/certs/ca-certificates.crt, plus the files in /etc/ssl/certs. It prints, as JSON,
// how many roots that pool holds and, given HOST:PORT, what GET https://HOST:PORT/v2/
// answered (or why it failed).
package main

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"
)

type result struct {
	Roots  int    `json:"roots"`
	Status int    `json:"status,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	pool, err := x509.SystemCertPool()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tls-get:", err)
		os.Exit(1)
	}
	//lint:ignore SA1019 the pool is a plain one on Linux: Subjects lists every root.
	out := result{Roots: len(pool.Subjects())}
	if len(os.Args) > 1 {
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Get("https://" + os.Args[1] + "/v2/")
		if err != nil {
			out.Error = err.Error()
		} else {
			resp.Body.Close()
			out.Status = resp.StatusCode
		}
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
