// install-plugins copies every regular file of a directory into another,
// executable: what the chart's credential-providers initContainer runs when
// the plugin image has no cp (credentialProviders.command), as distroless
// images have none.
//
// Usage: install-plugins SOURCE-DIR TARGET-DIR
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func copyFile(source, target string) error {
	in, err := os.Open(source)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: install-plugins SOURCE-DIR TARGET-DIR")
		os.Exit(2)
	}
	entries, err := os.ReadDir(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "install-plugins:", err)
		os.Exit(1)
	}
	for _, entry := range entries {
		if !entry.Type().IsRegular() {
			continue
		}
		target := filepath.Join(os.Args[2], entry.Name())
		if err := copyFile(filepath.Join(os.Args[1], entry.Name()), target); err != nil {
			fmt.Fprintln(os.Stderr, "install-plugins:", err)
			os.Exit(1)
		}
		fmt.Println("installed", target)
	}
}
