// test-credential-provider: a kubelet credential-provider exec plugin for the tests.
//
// It speaks credentialprovider.kubelet.k8s.io/v1 exactly as ecr-credential-provider
// does: a CredentialProviderRequest on stdin, a CredentialProviderResponse on stdout.
// The login it returns is a short-lived robot password minted by the e2e token
// server (GET $TOKEN_URL?ttl=N with the robot's own secret), so an expired login
// is refused by the registry for real.
//
// Flags select the response's cacheKeyType, cacheDuration, apiVersion and auth
// key, and the faults the tests need: exit non-zero, hang, answer malformed JSON,
// write without end, and echo the password on stderr (which mirrorgate must
// redact). With --fault-file, a test switches faults on and off while mirrorgate
// keeps running the plugin.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

type request struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Image      string `json:"image"`
}

type authConfig struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

type response struct {
	APIVersion    string                `json:"apiVersion"`
	Kind          string                `json:"kind"`
	CacheKeyType  string                `json:"cacheKeyType"`
	CacheDuration string                `json:"cacheDuration,omitempty"`
	Auth          map[string]authConfig `json:"auth"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "test-credential-provider: "+format+"\n", args...)
	os.Exit(1)
}

func mint(ttl int) (string, error) {
	pool := x509.NewCertPool()
	pem, err := os.ReadFile(os.Getenv("CA_FILE"))
	if err != nil {
		return "", err
	}
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequest("GET", os.Getenv("TOKEN_URL")+"?ttl="+url.QueryEscape(fmt.Sprint(ttl)), nil)
	if err != nil {
		return "", err
	}
	req.SetBasicAuth(os.Getenv("ROBOT"), os.Getenv("ROBOT_SECRET"))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("token server answered %d", resp.StatusCode)
	}
	var minted struct {
		Password string `json:"password"`
	}
	if err := json.Unmarshal(body, &minted); err != nil || minted.Password == "" {
		return "", fmt.Errorf("token server answered no password")
	}
	return minted.Password, nil
}

func main() {
	ttl := flag.Int("ttl", 60, "lifetime of the minted password, seconds")
	keyType := flag.String("cache-key-type", "Registry", "Image, Registry or Global")
	duration := flag.String("cache-duration", "", "cacheDuration of the response (default: none)")
	authKey := flag.String("auth-key", "", "the auth key (default: the image's registry host)")
	apiVersion := flag.String("api-version", "", "the response's apiVersion (default: the request's)")
	fault := flag.String("fault", "", "exit, hang, malformed, flood or echo")
	faultFile := flag.String("fault-file", "", "a file whose content, while it exists, is the fault")
	flag.Parse()
	if *faultFile != "" {
		if content, err := os.ReadFile(*faultFile); err == nil {
			*fault = strings.TrimSpace(string(content))
		}
	}

	var req request
	if err := json.NewDecoder(io.LimitReader(os.Stdin, 1<<20)).Decode(&req); err != nil {
		fail("reading the request: %v", err)
	}
	if req.Kind != "CredentialProviderRequest" || req.Image == "" {
		fail("not a CredentialProviderRequest with an image")
	}
	switch *fault {
	case "exit":
		fail("refusing on purpose")
	case "hang":
		fmt.Fprintln(os.Stderr, "test-credential-provider: hanging on purpose")
		time.Sleep(time.Hour)
	case "flood":
		// Without end: only mirrorgate's limits stop it.
		line := strings.Repeat("x", 1023) + "\n"
		for {
			fmt.Fprint(os.Stderr, line)
			fmt.Print(line)
		}
	case "malformed":
		fmt.Print(`{"apiVersion": "` + req.APIVersion + `", "kind": "CredentialProviderResponse", "auth": `)
		return
	}
	password, err := mint(*ttl)
	if err != nil {
		fail("minting a password: %v", err)
	}
	if *fault == "echo" {
		fmt.Fprintf(os.Stderr, "debug: minted password %s for %s\n", password, os.Getenv("ROBOT"))
	}
	key := *authKey
	if key == "" {
		key = strings.SplitN(req.Image, "/", 2)[0]
	}
	if *apiVersion == "" {
		*apiVersion = req.APIVersion
	}
	out := response{APIVersion: *apiVersion, Kind: "CredentialProviderResponse",
		CacheKeyType: *keyType, CacheDuration: *duration,
		Auth: map[string]authConfig{key: {Username: os.Getenv("ROBOT"), Password: password}}}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("writing the response: %v", err)
	}
}
